//! Robustness of the parsers that take outside input — sizes, durations, modes, `-o` option
//! strings, bucket sources, the RDMA reply headers, loopback tokens: hundreds of thousands of
//! generated and mutated inputs each, none of which may panic. This runs in every `cargo test`;
//! the coverage-guided fuzz targets in `fuzz/` (scripts/fuzz) search the same parsers deeper.
#![cfg(test)]

use s3rdma_proto::reply::{judge_get, judge_put, parse_bytes_transferred, parse_reply};
use s3rdma_proto::units::{parse_duration, parse_mode, parse_size};

struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A string of up to `max` characters drawn mostly from `alphabet`, sometimes any char.
    fn string(&mut self, alphabet: &[char], max: usize) -> String {
        let len = (self.next() % (max as u64 + 1)) as usize;
        (0..len)
            .map(|_| {
                let r = self.next();
                if r.is_multiple_of(16) {
                    char::from_u32((r >> 8) as u32 % 0x11_0000).unwrap_or('\u{fffd}')
                } else {
                    alphabet[(r >> 8) as usize % alphabet.len()]
                }
            })
            .collect()
    }

    /// `seed` with a few characters replaced, inserted or removed.
    fn mutate(&mut self, seed: &str, alphabet: &[char]) -> String {
        let mut v: Vec<char> = seed.chars().collect();
        for _ in 0..1 + self.next() % 3 {
            let at = if v.is_empty() {
                0
            } else {
                (self.next() % v.len() as u64) as usize
            };
            let c = alphabet[(self.next() % alphabet.len() as u64) as usize];
            match self.next() % 3 {
                0 if !v.is_empty() => v[at] = c,
                1 => v.insert(at, c),
                _ if !v.is_empty() => {
                    v.remove(at);
                }
                _ => v.push(c),
            }
        }
        v.into_iter().collect()
    }
}

const NUMERIC: &[char] = &[
    '0', '1', '2', '5', '7', '9', '.', '-', '+', 'e', 'E', 'k', 'K', 'M', 'G', 'T', 'P', 'i', 'B',
    'b', 's', 'm', 'h', 'n', ' ', 'x', '_', ',',
];
const OPTION: &[char] = &[
    'a', 'c', 'e', 'o', 'r', 'w', '_', '=', ',', '\\', '1', '6', 'M', 's', ' ', ':', '/', '.',
];
const HEX: &[char] = &['0', '1', '9', 'a', 'f', 'A', 'F', 'g', ':', '-', ' ', 'x'];

const N: usize = 200_000;

#[test]
fn unit_parsers_never_panic() {
    let mut g = Gen(0x1234_5678_9abc_def1);
    let seeds = [
        "16MiB",
        "1.5s",
        "0644",
        "4G",
        "500ms",
        "indefinite",
        "1e3",
        "9999999999999999999T",
    ];
    for i in 0..N {
        let s = if i % 2 == 0 {
            g.string(NUMERIC, 24)
        } else {
            let seed = seeds[i % seeds.len()];
            g.mutate(seed, NUMERIC)
        };
        let _ = parse_size(&s);
        let _ = parse_duration(&s);
        let _ = parse_mode(&s);
    }
}

#[test]
fn mount_option_strings_never_panic() {
    let mut g = Gen(0xdead_beef_cafe_f00d);
    let seeds = [
        "endpoint_url=http://127.0.0.1:8333,force_path_style,cache_size=64M",
        "ro,allow_other,uid=1000,rdma=auto,max_threads=16",
        "write_part_size=5MiB,write_buffer_size=32MiB,shutdown_grace=30s",
        "log_level=debug,comment=x\\,y,x-systemd.automount",
    ];
    for i in 0..N / 10 {
        let opts = if i % 3 == 0 {
            g.string(OPTION, 60)
        } else {
            g.mutate(seeds[i % seeds.len()], OPTION)
        };
        let parsed = <crate::cli::Cli as clap::Parser>::try_parse_from([
            "s3rdma", "bucket", "/mnt", "-o", &opts,
        ]);
        if let Ok(cli) = parsed {
            let _ = crate::cli::Settings::from_cli(cli);
        }
        let _ = crate::cli::parse_source(&g.string(OPTION, 30));
    }
}

#[test]
fn endpoint_replies_and_tokens_never_panic() {
    let mut g = Gen(0x0bad_f00d_1234_4321);
    let seeds = [
        "200",
        "206",
        "501",
        "1048576",
        "-1",
        "18446744073709551616",
        "",
    ];
    for i in 0..N {
        let v = if i % 2 == 0 {
            g.string(NUMERIC, 22)
        } else {
            g.mutate(seeds[i % seeds.len()], NUMERIC)
        };
        let asked = g.next() % (1 << 33);
        let _ = parse_reply(Some(&v));
        let _ = parse_bytes_transferred(Some(&v), asked);
        let status = [200u16, 206, 400, 412, 500, 501][i % 6];
        let etag = (i % 3 != 0).then_some(v.as_str());
        let _ = judge_put(status, Some(&v), etag);
        let _ = judge_get(status, Some(&v), Some(&v), asked, i % 2 == 0);
        let tok = if i % 2 == 0 {
            g.string(HEX, 90)
        } else {
            g.mutate(
                "0000000000001000:00000400:00001234:0001:abcdef:1:0123456789abcdef0123456789abcdef",
                HEX,
            )
        };
        let _ = s3rdma_proto::loopback_token::LoopbackToken::parse(&tok);
    }
}
