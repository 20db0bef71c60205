//! Small files in one request (see `fs::small`): the requests a dataset of small files costs,
//! from the store's counters, epoch after epoch.

use std::time::Duration;

use fuser::{Errno, FileType};
use s3rdma_client::testing::{Fault, Op};
use s3rdma_client::{FileMeta, ObjectStore};

use super::{strict_config, Fx};
use crate::fs::FsConfig;

/// A real mount's defaults: answers trusted for 1 s.
fn defaults() -> FsConfig {
    let mut cfg = strict_config();
    cfg.dir_markers = true;
    cfg.metadata_ttl = Duration::from_millis(300);
    cfg.negative_ttl = Duration::from_millis(300);
    cfg
}

const FILES: usize = 40;

fn dataset(fx: &Fx) -> Vec<(String, Vec<u8>)> {
    (0..FILES)
        .map(|i| {
            let (path, data) = (format!("ds/s{i:03}"), vec![i as u8; 20_000 + i]);
            fx.mem().put_external(&path, &data);
            (path, data)
        })
        .collect()
}

/// (HEAD, GET, LIST) requests so far.
fn counts(fx: &Fx) -> (u64, u64, u64) {
    let m = fx.mem();
    (
        m.requests(Op::Head),
        m.requests(Op::Get),
        m.requests(Op::List),
    )
}

fn read_all(fx: &Fx, files: &[(String, Vec<u8>)]) {
    for (path, data) in files {
        assert!(fx.read(path).unwrap() == *data, "{path}");
    }
}

// [S-READ-WHOLE]
#[test]
fn a_small_file_read_costs_one_get_after_a_listing_and_without_one() {
    let fx = Fx::with_config(defaults());
    let files = dataset(&fx);
    // Listed first (os.listdir, then each file).
    let fx = fx.remount();
    assert_eq!(fx.ls("ds").unwrap().len(), FILES);
    let before = counts(&fx);
    read_all(&fx, &files);
    let after = counts(&fx);
    assert_eq!(after.0 - before.0, 0, "no HeadObject");
    assert_eq!(after.1 - before.1, FILES as u64, "one GET per file");
    assert_eq!(after.2, before.2, "no listing");
    // Not listed (paths from a manifest): the lookup's probe, then the one GET.
    let fx = fx.remount();
    let before = counts(&fx);
    read_all(&fx, &files);
    let after = counts(&fx);
    assert_eq!(after.0 - before.0, 0, "no HeadObject");
    assert_eq!(after.1 - before.1, FILES as u64, "one GET per file");
    assert!(after.2 - before.2 <= FILES as u64 + 2, "a probe per name");
    assert_eq!(
        fx.fs
            .cache
            .stats
            .whole_fetches
            .load(std::sync::atomic::Ordering::Relaxed),
        FILES as u64
    );
}

// [S-READ-WHOLE]
#[test]
fn a_second_epoch_transfers_nothing_again_and_trusted_metadata_asks_nothing() {
    let fx = Fx::with_config(defaults());
    let files = dataset(&fx);
    let fx = fx.remount();
    fx.ls("ds").unwrap();
    read_all(&fx, &files);
    // Past the metadata TTL: one HeadObject per file revalidates it, the bytes are cached.
    std::thread::sleep(Duration::from_millis(350));
    let before = counts(&fx);
    let bytes = fx
        .mem()
        .stats()
        .http_bytes_read
        .load(std::sync::atomic::Ordering::Relaxed);
    read_all(&fx, &files);
    let after = counts(&fx);
    assert_eq!(after.1 - before.1, 0, "no GET in the second epoch");
    assert_eq!(
        after.0 - before.0,
        FILES as u64,
        "one revalidation per file"
    );
    assert_eq!(
        fx.mem()
            .stats()
            .http_bytes_read
            .load(std::sync::atomic::Ordering::Relaxed),
        bytes,
        "no object byte again"
    );
    // Trusted metadata (--metadata-ttl 1h --open-trusts-metadata): no request at all.
    let mut cfg = defaults();
    cfg.metadata_ttl = Duration::from_secs(3600);
    cfg.open_trusts_metadata = true;
    let fx = Fx::over(fx.store.clone(), cfg);
    fx.ls("ds").unwrap();
    read_all(&fx, &files);
    let before = counts(&fx);
    read_all(&fx, &files);
    assert_eq!(counts(&fx), before, "the second epoch asks nothing");
}

// [S-READ-WHOLE]
#[test]
fn a_stat_never_fetches_a_large_object_and_a_get_answers_as_a_head_does() {
    let fx = Fx::with_config(defaults());
    let meta = FileMeta {
        mode: Some(0o600),
        uid: Some(1234),
        gid: Some(5678),
        mtime: Some(std::time::UNIX_EPOCH + Duration::from_secs(1_600_000_000)),
        ..FileMeta::default()
    };
    fx.mem()
        .put_external_with("big", &vec![1u8; 3 << 20], meta.clone());
    fx.mem()
        .put_external_with("small", &vec![2u8; 3000], meta.clone());
    let fx = fx.remount();
    let before = counts(&fx);
    let big = fx.stat("big").unwrap();
    let after = counts(&fx);
    assert_eq!(after.1, before.1, "no GET of a large object by stat");
    assert_eq!(after.0 - before.0, 1, "one HeadObject");
    // The small one's attributes come from a GET; the same file asked with HeadObject (the
    // answer expired) says the same.
    let by_get = fx.stat("small").unwrap();
    assert_eq!(counts(&fx).1 - after.1, 1);
    std::thread::sleep(Duration::from_millis(350));
    let heads = counts(&fx).0;
    let by_head = fx
        .fs
        .serve("getattr", fx.fs.do_getattr(by_get.ino.0))
        .unwrap();
    assert_eq!(counts(&fx).0 - heads, 1);
    let key = |a: &fuser::FileAttr| (a.perm, a.uid, a.gid, a.mtime, a.kind);
    assert_eq!(key(&by_get), key(&by_head));
    assert_eq!(
        key(&by_get),
        (
            0o600,
            1234,
            5678,
            meta.mtime.unwrap(),
            fuser::FileType::RegularFile
        )
    );
    assert_eq!((big.perm, big.uid), (0o600, 1234));
    // Opening and reading the small one needs no request more.
    let n = counts(&fx);
    assert_eq!(fx.read("small").unwrap(), vec![2u8; 3000]);
    assert_eq!(counts(&fx).1, n.1);
}

// [S-READ-AHEAD-GET]
#[test]
fn in_a_directory_of_small_files_the_get_goes_beside_the_lookups_listing() {
    let fx = Fx::with_config(defaults());
    let files = dataset(&fx);
    let fx = fx.remount();
    // The first name of a directory: the listing, then the GET.
    read_all(&fx, &files[..1]);
    // The next listing stalls: the GET of the next file is sent while it does.
    fx.store
        .inject(Some(Op::List), Fault::Stall(Duration::from_secs(3)), 1, 1);
    let gets = fx.store.requests(Op::Get);
    std::thread::scope(|s| {
        let reader = s.spawn(|| read_all(&fx, &files[1..2]));
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while fx.store.requests(Op::Get) == gets && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            fx.store.requests(Op::Get) > gets && !reader.is_finished(),
            "the GET was sent while the listing was under way"
        );
    });
    // Still one GET and no HeadObject per file.
    let before = counts(&fx);
    read_all(&fx, &files[2..]);
    let after = counts(&fx);
    assert_eq!(after.0 - before.0, 0, "no HeadObject");
    assert_eq!(after.1 - before.1, (FILES - 2) as u64, "one GET per file");
}

// [S-READ-AHEAD-GET]
#[test]
fn a_get_beside_a_lookup_costs_one_request_and_a_bounded_transfer_when_it_misses() {
    let fx = Fx::with_config(defaults());
    for name in ["s1", "s2", "s3"] {
        fx.mem().put_external(&format!("d/{name}"), &[1u8; 3000]);
    }
    fx.mem().put_external("d/big", &vec![2u8; 3 << 20]);
    fx.mem().put_external("d/sub/x", b"x");
    let fx = fx.remount();
    let waste = || {
        fx.fs
            .cache
            .stats
            .whole_fetch_waste
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let gets = |fx: &Fx| counts(fx).1;
    fx.stat("d/s1").unwrap();
    // A missing name after a small file: one GET in vain; the next asks with the listing only.
    let before = gets(&fx);
    assert_eq!(fx.stat("d/none").unwrap_err(), Errno::ENOENT);
    assert_eq!(gets(&fx) - before, 1);
    let before = gets(&fx);
    assert_eq!(fx.stat("d/none2").unwrap_err(), Errno::ENOENT);
    assert_eq!(gets(&fx), before, "no GET after a miss");
    // A directory after a small file: the same.
    fx.stat("d/s2").unwrap();
    let before = gets(&fx);
    assert_eq!(fx.stat("d/sub").unwrap().kind, FileType::Directory);
    assert_eq!(gets(&fx) - before, 1);
    // A large file after a small one: at most twice the sibling's size transferred, counted
    // as waste, and its attributes are right.
    fx.stat("d/s3").unwrap();
    let (before, wasted) = (gets(&fx), waste());
    let big = fx.stat("d/big").unwrap();
    assert_eq!(big.size, 3 << 20);
    assert_eq!(gets(&fx) - before, 1);
    assert!(waste() > wasted);
    assert!(
        waste() - wasted <= 6000,
        "{} bytes wasted",
        waste() - wasted
    );
    assert_eq!(fx.read("d/big").unwrap(), vec![2u8; 3 << 20]);
}
