use std::io::{Read, Seek, SeekFrom};
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::common::*;

fn sha(data: &[u8]) -> Vec<u8> {
    Sha256::digest(data).to_vec()
}

// [S-READ-RANGED] [S-READ-AHEAD]
#[test]
fn read_256mib_object_matches_by_checksum() {
    let b = bucket("big");
    let data = pattern(256 << 20, 1);
    put(&b, "shard-0000.tar", data.clone());
    let want = sha(&data);
    drop(data);
    let m = Mount::new(&b, &[]);
    let start = Instant::now();
    let mut f = std::fs::File::open(m.join("shard-0000.tar")).unwrap();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0usize;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n;
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!("read 256 MiB through the mount: {:.0} MiB/s", 256.0 / secs);
    assert_eq!(total, 256 << 20);
    assert_eq!(hasher.finalize().to_vec(), want);
    // Sequential reads go in whole parts (8 MiB by default), not per kernel request.
    let gets = m.count_requests("GetObject");
    assert!((32..=40).contains(&gets), "{gets} GETs for 32 parts");
}

// [S-READ-RANDOM]
#[test]
fn random_seek_and_read_returns_the_right_bytes() {
    let b = bucket("random");
    let len = 20 << 20;
    let data = pattern(len, 2);
    put(&b, "blob.bin", data.clone());
    // Small parts so that reads cross part boundaries often.
    let m = Mount::new(&b, &["--read-part-size", "1MiB", "--max-prefetch", "4MiB"]);
    let mut f = std::fs::File::open(m.join("blob.bin")).unwrap();
    let mut x: u64 = 12345;
    for i in 0..200 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let off = (x >> 16) as usize % len;
        let want = [1usize, 4096, 100_000, 1 << 20, 3 << 20][i % 5].min(len - off);
        f.seek(SeekFrom::Start(off as u64)).unwrap();
        let mut got = vec![0u8; want];
        f.read_exact(&mut got).unwrap();
        assert!(
            got == data[off..off + want],
            "mismatch at offset {off} len {want}"
        );
    }
    // Reads at and past the end.
    f.seek(SeekFrom::Start(len as u64 - 10)).unwrap();
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).unwrap();
    assert_eq!(tail, &data[len - 10..]);
    f.seek(SeekFrom::Start(len as u64 + 100)).unwrap();
    assert_eq!(f.read(&mut [0u8; 16]).unwrap(), 0);
}

// [S-READ-SMALL]
#[test]
fn empty_and_tiny_files() {
    let b = bucket("tiny");
    put(&b, "empty", Vec::new());
    put(&b, "one", b"1".to_vec());
    let m = Mount::new(&b, &[]);
    assert_eq!(std::fs::read(m.join("empty")).unwrap(), b"");
    assert_eq!(std::fs::metadata(m.join("empty")).unwrap().len(), 0);
    assert_eq!(std::fs::read(m.join("one")).unwrap(), b"1");
}

// [S-READ-WHOLE]
#[test]
fn a_dataset_of_small_files_costs_one_get_per_file_and_a_stat_wastes_a_bounded_amount() {
    let b = bucket("whole");
    // Sizes around the cache's units (16 KiB by default) and the 1 MiB bound.
    let sizes = [1usize, 100, 4096, 65536, 65537, 256 << 10, 1 << 20];
    let files: Vec<(String, Vec<u8>)> = (0..42)
        .map(|i| {
            (
                format!("ds/f{i:03}"),
                pattern(sizes[i % sizes.len()], i as u64),
            )
        })
        .collect();
    for (key, data) in &files {
        put(&b, key, data.clone());
    }
    put(&b, "large/one", pattern((1 << 20) + 1, 99));
    let count = |m: &Mount| {
        (
            m.count_requests("HeadObject"),
            m.count_requests("GetObject"),
            m.count_requests("ListObjectsV2"),
        )
    };
    let read_all = |m: &Mount| {
        for (key, data) in &files {
            assert!(std::fs::read(m.join(key)).unwrap() == *data, "{key}");
        }
    };
    // Listed first (os.listdir, then each file), then from a manifest on a fresh mount.
    for listed in [true, false] {
        // Listed, the files of a link's size (1 and 100 bytes here) are asked about with
        // HeadObject first, so that the listing tells their type [S-NS-TYPE].
        let m = Mount::new(&b, &[]);
        let before = count(&m);
        if listed {
            let n = std::fs::read_dir(m.join("ds")).unwrap().count();
            assert_eq!(n, files.len());
        }
        read_all(&m);
        let after = count(&m);
        let link_sized = files.iter().filter(|(_, d)| d.len() < 4096).count();
        let heads = if listed { link_sized } else { 0 };
        // From a manifest, each lookup after the first sends its GET beside its listing, with
        // room for twice the largest file found before it [S-READ-AHEAD-GET]: a file larger
        // than that costs a GET more, and the bytes of the short one are counted as waste.
        let (mut largest, mut short, mut wasted) = (0usize, 0usize, 0u64);
        for (_, data) in files.iter().filter(|_| !listed) {
            let room = (2 * largest).min(1 << 20);
            if largest > 0 && data.len() > room {
                (short, wasted) = (short + 1, wasted + room as u64);
            }
            largest = largest.max(data.len());
        }
        assert!(listed || short > 0, "the sizes try the room");
        assert_eq!(after.0 - before.0, heads, "HeadObject (listed: {listed})");
        assert_eq!(
            after.1 - before.1,
            files.len() + short,
            "one GET per file (listed: {listed})"
        );
        if listed {
            assert!(after.2 - before.2 <= 2, "the lookup of ds and its listing");
        }
        let stats = mount_stats(&m.path);
        // (A file whose open came within 100 ms of its HeadObject reuses that answer and
        // reads with a ranged GET instead: still one GET.)
        let whole = stat_value(&stats, "whole_fetches") as usize;
        assert!(
            (files.len() - heads - short..=files.len() - short).contains(&whole),
            "{whole}"
        );
        assert_eq!(stat_value(&stats, "whole_fetch_waste_bytes"), wasted);
        // A file over the bound: its stat is one HeadObject and no byte.
        let before = count(&m);
        let len = std::fs::metadata(m.join("large/one")).unwrap().len();
        assert_eq!(len, (1 << 20) + 1);
        let after = count(&m);
        assert_eq!((after.0 - before.0, after.1 - before.1), (1, 0));
    }
    // Stat without reading, in a cache of 16 MiB: the files fetched whole and evicted unread
    // are counted as waste, at most their bytes, and every one still reads right.
    let keys: Vec<String> = (0..24).map(|i| format!("mib/f{i:02}")).collect();
    put_many(&b, keys.clone(), &MIB);
    let m = Mount::new(&b, &["--cache-size", "16MiB", "--read-part-size", "1MiB"]);
    for key in &keys {
        assert_eq!(std::fs::metadata(m.join(key)).unwrap().len(), 1 << 20);
    }
    let stats = mount_stats(&m.path);
    assert_eq!(stat_value(&stats, "whole_fetches"), keys.len() as u64);
    let waste = stat_value(&stats, "whole_fetch_waste_bytes");
    assert!((8 << 20..=24 << 20).contains(&waste), "waste {waste}");
    for key in &keys {
        assert!(std::fs::read(m.join(key)).unwrap() == MIB, "{key}");
    }
}

/// A 1 MiB body: a small file at the bound.
static MIB: [u8; 1 << 20] = [7u8; 1 << 20];

// [S-READ-PINNED] [S-OPEN-FRESH]
#[test]
fn object_replaced_while_open_fails_old_handle_and_reopen_sees_new() {
    let b = bucket("replace");
    let len = 32 << 20;
    let v1 = pattern(len, 3);
    let v2 = pattern(len, 4);
    put(&b, "model.bin", v1.clone());
    let m = Mount::new(&b, &["--read-part-size", "1MiB", "--max-prefetch", "2MiB"]);
    let mut old = std::fs::File::open(m.join("model.bin")).unwrap();
    let mut head = vec![0u8; 4096];
    old.read_exact(&mut head).unwrap();
    assert_eq!(head, v1[..4096]);

    put(&b, "model.bin", v2.clone());

    // Far from what was read or prefetched: needs a new GET, which If-Match refuses.
    old.seek(SeekFrom::Start(30 << 20)).unwrap();
    let mut buf = vec![0u8; 65536];
    let err = old
        .read_exact(&mut buf)
        .expect_err("read of a replaced object must fail");
    assert_eq!(err.raw_os_error(), Some(libc::ESTALE), "{err}");
    // Whatever the old handle still returns comes from v1, never v2.
    old.seek(SeekFrom::Start(0)).unwrap();
    if old.read_exact(&mut head).is_ok() {
        assert_eq!(head, v1[..4096]);
    }
    assert!(m
        .log_text()
        .contains("replaced or deleted since it was opened"));

    // A new open pins the new version.
    let got = std::fs::read(m.join("model.bin")).unwrap();
    assert!(got == v2, "reopen must read the new object");
    drop(old);

    // A replacement of a different size: the new size is seen at once on reopen.
    let v3 = pattern(len + 12345, 5);
    put(&b, "model.bin", v3.clone());
    let got = std::fs::read(m.join("model.bin")).unwrap();
    assert_eq!(got.len(), v3.len());
    assert!(got == v3);
}

// [S-READ-DELETED]
#[test]
fn object_deleted_while_open() {
    let b = bucket("deleted");
    let v1 = pattern(8 << 20, 6);
    put(&b, "f", v1.clone());
    let m = Mount::new(&b, &["--read-part-size", "1MiB", "--max-prefetch", "1MiB"]);
    let mut f = std::fs::File::open(m.join("f")).unwrap();
    let mut buf = vec![0u8; 4096];
    f.read_exact(&mut buf).unwrap();
    delete(&b, "f");
    f.seek(SeekFrom::Start(6 << 20)).unwrap();
    let err = f
        .read_exact(&mut buf)
        .expect_err("read of a deleted object must fail");
    // The pinned version is gone: ESTALE, whether the server answers 404 or 412.
    assert_eq!(err.raw_os_error(), Some(libc::ESTALE), "{err}");
    drop(f);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(
        std::fs::File::open(m.join("f")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
}

// [S-WRITE-EROFS]
#[test]
fn a_read_only_mount_refuses_writes_with_erofs() {
    let b = bucket("rofs");
    put(&b, "f", b"x".to_vec());
    let m = Mount::new(&b, &["--read-only"]);
    let erofs =
        |r: std::io::Result<()>| assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    erofs(std::fs::write(m.join("new"), b"y"));
    erofs(
        std::fs::OpenOptions::new()
            .append(true)
            .open(m.join("f"))
            .map(|_| ()),
    );
    erofs(std::fs::create_dir(m.join("d")));
    erofs(std::fs::remove_file(m.join("f")));
    erofs(std::fs::rename(m.join("f"), m.join("g")));
    erofs(
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(m.join("f"))
            .map(|_| ()),
    );
    assert_eq!(std::fs::read(m.join("f")).unwrap(), b"x");
}

// [S-OPEN-FRESH]
#[test]
fn kernel_pages_of_an_old_version_are_dropped_even_after_a_listing() {
    let b = bucket("pages");
    let (v1, v2) = (pattern(1 << 20, 80), pattern(1 << 20, 81));
    put(&b, "d/f", v1.clone());
    let m = Mount::new(&b, &["--metadata-ttl", "100ms"]);
    assert!(
        std::fs::read(m.join("d/f")).unwrap() == v1,
        "v1 (now in the kernel page cache)"
    );
    put(&b, "d/f", v2.clone());
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The listing learns the new ETag before any open does.
    let _ = std::fs::read_dir(m.join("d")).unwrap().count();
    assert!(
        std::fs::read(m.join("d/f")).unwrap() == v2,
        "same size, new bytes: no stale pages"
    );
    // Unchanged since the last open: the kernel keeps its pages (no GET).
    let gets = m.count_requests("GetObject");
    assert!(std::fs::read(m.join("d/f")).unwrap() == v2);
    assert_eq!(
        m.count_requests("GetObject"),
        gets,
        "warm re-read from the kernel page cache"
    );
}
