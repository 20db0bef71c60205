//! Eviction policy, measured: the cache's own bookkeeping (LRU with drop-behind) replayed on
//! block-access traces of the workloads the mount serves, beside moka's TinyLFU (the
//! alternative the design named) fed the same traces. Run with `--nocapture` to see the table;
//! the assertions pin down the properties the cache relies on.
#![cfg(test)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::{Access, BlockKey, CacheStats, Claim, Inner};

const BLOCKS: usize = 128;

/// One step of a trace: the reader moves past `demote` (drop-behind), then reads `read` the
/// way `access` says; `done` marks the end of a file (the reader demotes the block it read).
struct Step {
    read: BlockKey,
    access: Access,
    demote: Option<BlockKey>,
    done: bool,
}

fn key(file: &str, index: u64) -> BlockKey {
    BlockKey {
        key: Arc::from(file),
        etag: Arc::from("\"e\""),
        index,
    }
}

/// A sequential reader of `blocks` blocks of `file`, as the reader drives the cache: entering
/// block i demotes block i - 2, and the last block is demoted at the end of the file.
fn sequential(file: &str, blocks: u64) -> impl Iterator<Item = Step> + '_ {
    (0..blocks).map(move |i| Step {
        read: key(file, i),
        access: Access::Enter,
        demote: (i >= 2).then(|| key(file, i - 2)),
        done: i + 1 == blocks,
    })
}

fn random(file: &str, index: u64) -> Step {
    Step {
        read: key(file, index),
        access: Access::Once,
        demote: None,
        done: false,
    }
}

trait Policy {
    fn name(&self) -> &'static str;
    /// Whether the read was a hit.
    fn access(&mut self, step: &Step) -> bool;
}

/// The cache's own bookkeeping, driven exactly as `Cache::get`, `BlockRef::drop` and the
/// reader drive it (a fill always succeeds here).
struct Ours {
    inner: Inner,
    stats: CacheStats,
}

impl Policy for Ours {
    fn name(&self) -> &'static str {
        "ours: admission + drop-behind"
    }

    fn access(&mut self, step: &Step) -> bool {
        let inner = &mut self.inner;
        if let Some(d) = &step.demote {
            inner.demote(d);
        }
        inner.sketch.record(&step.read);
        let (slot, hit) = match inner.claim(&step.read, 1, step.access, &self.stats) {
            Claim::Hit(i, _, _) => (i, true),
            Claim::Fill(i, _) => {
                inner.filled(i, true);
                (i, false)
            }
            _ => unreachable!("every block is idle between steps"),
        };
        if step.done {
            inner.done_with(&step.read);
        }
        inner.release(slot, step.access == Access::Once);
        hit
    }
}

/// Plain LRU, for reference: what the cache would keep without admission or drop-behind.
struct Lru {
    ticks: HashMap<BlockKey, u64>,
    order: BTreeMap<u64, BlockKey>,
    clock: u64,
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        "plain LRU"
    }

    fn access(&mut self, step: &Step) -> bool {
        self.clock += 1;
        let hit = match self.ticks.insert(step.read.clone(), self.clock) {
            Some(old) => {
                self.order.remove(&old);
                true
            }
            None => false,
        };
        self.order.insert(self.clock, step.read.clone());
        if self.ticks.len() > BLOCKS {
            if let Some((_, k)) = self.order.pop_first() {
                self.ticks.remove(&k);
            }
        }
        hit
    }
}

struct TinyLfu(moka::sync::Cache<BlockKey, ()>);

impl Policy for TinyLfu {
    fn name(&self) -> &'static str {
        "TinyLFU (moka)"
    }

    fn access(&mut self, step: &Step) -> bool {
        if self.0.get(&step.read).is_some() {
            return true;
        }
        self.0.insert(step.read.clone(), ());
        self.0.run_pending_tasks();
        false
    }
}

fn policies() -> Vec<Box<dyn Policy>> {
    vec![
        Box::new(Lru {
            ticks: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
        }),
        Box::new(Ours {
            inner: Inner::new(BLOCKS, 1, 0),
            stats: CacheStats::default(),
        }),
        Box::new(TinyLfu(
            moka::sync::Cache::builder()
                .max_capacity(BLOCKS as u64)
                .build(),
        )),
    ]
}

/// Hit rate of `p` over the steps of `trace` that `counted` selects.
fn hit_rate(p: &mut dyn Policy, trace: &[Step], counted: impl Fn(usize, &Step) -> bool) -> f64 {
    let (mut hits, mut total) = (0u64, 0u64);
    for (n, step) in trace.iter().enumerate() {
        let hit = p.access(step);
        if counted(n, step) {
            total += 1;
            hits += u64::from(hit);
        }
    }
    hits as f64 / total.max(1) as f64
}

/// A hot set of ¾ of the cache read at random, while a scan of 16× the cache streams by (one
/// scan block per hot read). Counts the hot reads after warm-up.
fn hot_set_under_scan() -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(1);
    let hot = (BLOCKS * 3 / 4) as u64;
    let scan = sequential("scan", 16 * BLOCKS as u64);
    let mut t = Vec::new();
    // Warm the hot set first.
    t.extend((0..hot).map(|i| random("hot", i)));
    for s in scan {
        t.push(random("hot", rng.gen_range(0..hot)));
        t.push(s);
    }
    t
}

/// Five epochs of sequential reading of a file 1.5× the cache. Counts epochs 2–5.
fn epochs_over_a_larger_file() -> Vec<Step> {
    (0..5)
        .flat_map(|_| sequential("data", (BLOCKS * 3 / 2) as u64))
        .collect()
}

/// Random reads of 1-block records of a file 10× the cache, Zipf-distributed (s = 1).
fn zipf_random() -> Vec<Step> {
    let n = 10 * BLOCKS;
    let weights: Vec<f64> = (1..=n).map(|r| 1.0 / r as f64).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(n);
    let mut acc = 0.0;
    for w in weights {
        acc += w / total;
        cdf.push(acc);
    }
    // Popular records are spread over the file, not bunched at its start.
    let mut place: Vec<u64> = (0..n as u64).collect();
    let mut rng = StdRng::seed_from_u64(2);
    place.shuffle(&mut rng);
    (0..40 * BLOCKS)
        .map(|_| {
            let u: f64 = rng.gen();
            let rank = cdf.partition_point(|&c| c < u).min(n - 1);
            random("records", place[rank])
        })
        .collect()
}

/// Three epochs over 2× the cache of one-block files, each epoch in a new random order (a
/// shuffled dataset loader). Counts epochs 2–3.
fn shuffled_small_files() -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(3);
    let mut files: Vec<String> = (0..2 * BLOCKS).map(|i| format!("f{i}")).collect();
    let mut t = Vec::new();
    for _ in 0..3 {
        files.shuffle(&mut rng);
        t.extend(files.iter().map(|f| random(f, 0)));
    }
    t
}

struct Row {
    name: &'static str,
    rates: Vec<(&'static str, f64)>,
}

fn measure() -> Vec<Row> {
    let hot = hot_set_under_scan();
    let epochs = epochs_over_a_larger_file();
    let zipf = zipf_random();
    let small = shuffled_small_files();
    let warm = |skip: usize| move |n: usize, _: &Step| n >= skip;
    let mut rows = Vec::new();
    let mut run = |name: &'static str, trace: &[Step], counted: &dyn Fn(usize, &Step) -> bool| {
        let rates = policies()
            .into_iter()
            .map(|mut p| {
                let r = hit_rate(p.as_mut(), trace, counted);
                (p.name(), r)
            })
            .collect();
        rows.push(Row { name, rates });
    };
    run(
        "hot set (¾ cache) under a 16× scan",
        &hot,
        &|n, s: &Step| n >= BLOCKS / 2 && &*s.read.key == "hot",
    );
    run(
        "5 sequential epochs over 1.5× the cache",
        &epochs,
        &warm(BLOCKS * 3 / 2),
    );
    run("Zipf random reads over 10× the cache", &zipf, &warm(0));
    run(
        "3 shuffled epochs of small files, 2× the cache",
        &small,
        &warm(2 * BLOCKS),
    );
    rows
}

fn print(rows: &[Row]) {
    let names: Vec<&str> = rows[0].rates.iter().map(|r| r.0).collect();
    println!(
        "| workload ({BLOCKS}-block cache) | {} |",
        names.join(" | ")
    );
    println!("|---|{}", "---|".repeat(names.len()));
    for r in rows {
        let cells: Vec<String> = r
            .rates
            .iter()
            .map(|(_, v)| format!("{:.0} %", v * 100.0))
            .collect();
        println!("| {} | {} |", r.name, cells.join(" | "));
    }
}

// [S-CACHE-EVICTION]
#[test]
fn eviction_policies_on_the_mount_s_workloads() {
    let rows = measure();
    print(&rows);
    let (lru, ours) = (|i: usize| rows[i].rates[0].1, |i: usize| rows[i].rates[1].1);
    // A scan never pushes out a hot set that fits: every hot read after warm-up hits.
    assert!(ours(0) > 0.95, "hot set under a scan: {:.3}", ours(0));
    assert!(
        lru(0) < 0.9,
        "the scan trace must hurt plain LRU: {:.3}",
        lru(0)
    );
    // Epochs over a dataset larger than the cache: LRU keeps nothing, admission most of it.
    assert!(
        lru(1) < 0.05 && ours(1) > 0.45,
        "epochs: {:.3} vs {:.3}",
        lru(1),
        ours(1)
    );
    // Popularity: better than LRU. Uniformly shuffled epochs: frequency cannot help much (every
    // file is as popular as every other); no worse than LRU.
    assert!(ours(2) > lru(2), "zipf: {:.3} vs {:.3}", ours(2), lru(2));
    assert!(
        ours(3) > lru(3) - 0.05,
        "small files: {:.3} vs {:.3}",
        ours(3),
        lru(3)
    );
}
