//! The ceiling for any client: the AWS SDK itself reading the same bytes from the same server at
//! the same concurrency, as the read benchmark does through the mount.
//!
//!   sdk_bench ENDPOINT BUCKET seq KEY PART_SIZE STREAMS
//!   sdk_bench ENDPOINT BUCKET rand KEY IO_SIZE STREAMS COUNT
//!   sdk_bench ENDPOINT BUCKET files PREFIX STREAMS
//!   sdk_bench ENDPOINT BUCKET put KEY SIZE               (fills the benchmark bucket)
//!   sdk_bench ENDPOINT BUCKET put-files PREFIX COUNT SIZE STREAMS
//!   sdk_bench ENDPOINT BUCKET put-tree PREFIX DIRS FILES_PER_DIR STREAMS   (1-byte files dNNNN/fNNNNN)
//!   sdk_bench ENDPOINT BUCKET upload KEY SIZE PART_SIZE STREAMS   (timed multipart upload)
//!   sdk_bench ENDPOINT BUCKET make-bucket | drop-bucket      (make: one already ours is fine; drop: objects, uploads, bucket)
//!   sdk_bench ENDPOINT BUCKET list PREFIX                 (seconds to list a "directory")
//!   sdk_bench ENDPOINT BUCKET latency PREFIX COUNT        (median ms to the first byte of a GET)
//!   sdk_bench ENDPOINT BUCKET put-dir DIR PREFIX STREAMS  (seconds to upload a local tree)
//!   sdk_bench ENDPOINT BUCKET head KEY                    (the object's size, or -1)
//!   sdk_bench ENDPOINT BUCKET count PREFIX                (how many keys start with PREFIX)
//!
//! Prints `MiB/s` (for put modes: nothing; others as said). Credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.

// Tests and benchmark tools may keep a table of steps in one function.
#![allow(clippy::too_many_lines)]

use std::sync::Arc;
use std::time::Instant;

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use tokio::sync::Semaphore;

fn arg(args: &[String], i: usize) -> String {
    args.get(i).cloned().unwrap_or_else(|| {
        eprintln!("usage: see examples/sdk_read.rs");
        std::process::exit(2)
    })
}

async fn get(c: &aws_sdk_s3::Client, bucket: &str, key: &str, range: Option<(u64, u64)>) -> u64 {
    let mut req = c.get_object().bucket(bucket).key(key);
    if let Some((a, b)) = range {
        req = req.range(format!("bytes={a}-{b}"));
    }
    let out = req.send().await.expect("GET");
    let mut body = out.body;
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        n += chunk.expect("body").len() as u64;
    }
    n
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (endpoint, bucket, mode) = (arg(&args, 1), arg(&args, 2), arg(&args, 3));
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let conf = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            env("AWS_ACCESS_KEY_ID"),
            env("AWS_SECRET_ACCESS_KEY"),
            None,
            None,
            "bench",
        ))
        .force_path_style(true)
        .build();
    let c = aws_sdk_s3::Client::from_conf(conf);
    let start = Instant::now();
    let total: u64 = match mode.as_str() {
        "seq" => {
            // STREAMS readers, each reading the whole object in PART_SIZE ranges, PART_SIZE
            // ranges in flight per reader as the mount's read-ahead keeps them.
            let key = arg(&args, 4);
            let part: u64 = arg(&args, 5).parse().expect("part size");
            let streams: usize = arg(&args, 6).parse().expect("streams");
            let size = c
                .head_object()
                .bucket(&bucket)
                .key(&key)
                .send()
                .await
                .expect("HEAD")
                .content_length()
                .unwrap_or(0) as u64;
            let sem = Arc::new(Semaphore::new(streams * 8));
            let mut tasks = Vec::new();
            for _ in 0..streams {
                let mut off = 0;
                while off < size {
                    let end = (off + part).min(size) - 1;
                    let (c, b, k, sem) = (c.clone(), bucket.clone(), key.clone(), sem.clone());
                    tasks.push(tokio::spawn(async move {
                        let _p = sem.acquire().await;
                        get(&c, &b, &k, Some((off, end))).await
                    }));
                    off += part;
                }
            }
            let mut n = 0;
            for t in tasks {
                n += t.await.expect("task");
            }
            n
        }
        "rand" => {
            let key = arg(&args, 4);
            let io: u64 = arg(&args, 5).parse().expect("io size");
            let streams: usize = arg(&args, 6).parse().expect("streams");
            let count: u64 = arg(&args, 7).parse().expect("count");
            let size = c
                .head_object()
                .bucket(&bucket)
                .key(&key)
                .send()
                .await
                .expect("HEAD")
                .content_length()
                .unwrap_or(0) as u64;
            let sem = Arc::new(Semaphore::new(streams));
            let mut x = 12345u64;
            let mut tasks = Vec::new();
            for _ in 0..count {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let off = ((x >> 16) % (size / io)) * io;
                let (c, b, k, sem) = (c.clone(), bucket.clone(), key.clone(), sem.clone());
                tasks.push(tokio::spawn(async move {
                    let _p = sem.acquire().await;
                    get(&c, &b, &k, Some((off, off + io - 1))).await
                }));
            }
            let mut n = 0;
            for t in tasks {
                n += t.await.expect("task");
            }
            n
        }
        "files" => {
            let prefix = arg(&args, 4);
            let streams: usize = arg(&args, 5).parse().expect("streams");
            let mut keys = Vec::new();
            let mut token = None;
            loop {
                let out = c
                    .list_objects_v2()
                    .bucket(&bucket)
                    .prefix(&prefix)
                    .set_continuation_token(token)
                    .send()
                    .await
                    .expect("LIST");
                keys.extend(
                    out.contents()
                        .iter()
                        .filter_map(|o| o.key().map(str::to_string)),
                );
                token = out.next_continuation_token().map(str::to_string);
                if token.is_none() {
                    break;
                }
            }
            let sem = Arc::new(Semaphore::new(streams));
            let mut tasks = Vec::new();
            for k in keys {
                let (c, b, sem) = (c.clone(), bucket.clone(), sem.clone());
                tasks.push(tokio::spawn(async move {
                    let _p = sem.acquire().await;
                    get(&c, &b, &k, None).await
                }));
            }
            let mut n = 0;
            for t in tasks {
                n += t.await.expect("task");
            }
            n
        }
        "put" => {
            let key = arg(&args, 4);
            let size: usize = arg(&args, 5).parse().expect("size");
            let data = pseudo_random(size, 1);
            let _ = c.create_bucket().bucket(&bucket).send().await;
            c.put_object()
                .bucket(&bucket)
                .key(&key)
                .body(data.into())
                .send()
                .await
                .expect("PUT");
            return;
        }
        "upload" => {
            // The SDK's own multipart upload of bytes already in memory: the write ceiling.
            let key = arg(&args, 4);
            let size: usize = arg(&args, 5).parse().expect("size");
            let part: usize = arg(&args, 6).parse().expect("part size");
            let streams: usize = arg(&args, 7).parse().expect("streams");
            let data = bytes::Bytes::from(pseudo_random(size, 3));
            let start = Instant::now();
            let id = c
                .create_multipart_upload()
                .bucket(&bucket)
                .key(&key)
                .send()
                .await
                .expect("create")
                .upload_id()
                .expect("upload id")
                .to_string();
            let sem = Arc::new(Semaphore::new(streams));
            let mut tasks = Vec::new();
            for (i, off) in (0..size).step_by(part).enumerate() {
                let (c, b, k, id, sem) = (
                    c.clone(),
                    bucket.clone(),
                    key.clone(),
                    id.clone(),
                    sem.clone(),
                );
                let body = data.slice(off..(off + part).min(size));
                tasks.push(tokio::spawn(async move {
                    let _p = sem.acquire().await;
                    let n = i as i32 + 1;
                    let out = c
                        .upload_part()
                        .bucket(&b)
                        .key(&k)
                        .upload_id(&id)
                        .part_number(n)
                        .body(body.into())
                        .customize()
                        // As the mount does over loopback/HTTPS: no SHA-256 of the payload.
                        .disable_payload_signing()
                        .send()
                        .await
                        .expect("part");
                    aws_sdk_s3::types::CompletedPart::builder()
                        .part_number(n)
                        .e_tag(out.e_tag().unwrap_or_default())
                        .build()
                }));
            }
            let mut parts = Vec::new();
            for t in tasks {
                parts.push(t.await.expect("task"));
            }
            c.complete_multipart_upload()
                .bucket(&bucket)
                .key(&key)
                .upload_id(&id)
                .multipart_upload(
                    aws_sdk_s3::types::CompletedMultipartUpload::builder()
                        .set_parts(Some(parts))
                        .build(),
                )
                .send()
                .await
                .expect("complete");
            let secs = start.elapsed().as_secs_f64();
            println!("{:.1}", size as f64 / (1 << 20) as f64 / secs);
            return;
        }
        "list" => {
            // What `ls -l` of a directory needs: every page of ListObjectsV2 with "/".
            let prefix = arg(&args, 4);
            let mut token = None;
            loop {
                let out = c
                    .list_objects_v2()
                    .bucket(&bucket)
                    .prefix(&prefix)
                    .delimiter("/")
                    .set_continuation_token(token)
                    .send()
                    .await
                    .expect("LIST");
                token = out.next_continuation_token().map(str::to_string);
                if token.is_none() {
                    break;
                }
            }
            println!("{:.3}", start.elapsed().as_secs_f64());
            return;
        }
        "latency" => {
            let prefix = arg(&args, 4);
            let count: usize = arg(&args, 5).parse().expect("count");
            let mut ms = Vec::new();
            for i in 0..count {
                let t = Instant::now();
                let out = c
                    .get_object()
                    .bucket(&bucket)
                    .key(format!("{prefix}{i:05}.bin"))
                    .send()
                    .await
                    .expect("GET");
                let mut body = out.body;
                let _ = body.next().await;
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            ms.sort_by(f64::total_cmp);
            println!("{:.3}", ms[ms.len() / 2]);
            return;
        }
        "put-dir" => {
            let dir = std::path::PathBuf::from(arg(&args, 4));
            let prefix = arg(&args, 5);
            let streams: usize = arg(&args, 6).parse().expect("streams");
            let mut files = Vec::new();
            let mut todo = vec![dir.clone()];
            while let Some(d) = todo.pop() {
                for e in std::fs::read_dir(&d).expect("read_dir") {
                    let p = e.expect("entry").path();
                    if p.is_dir() {
                        todo.push(p);
                    } else {
                        files.push(p);
                    }
                }
            }
            let start = Instant::now();
            let sem = Arc::new(Semaphore::new(streams));
            let mut tasks = Vec::new();
            for f in files {
                let rel = f.strip_prefix(&dir).expect("under dir").to_string_lossy();
                let key = format!("{prefix}{rel}");
                let (c, b, sem) = (c.clone(), bucket.clone(), sem.clone());
                tasks.push(tokio::spawn(async move {
                    let _p = sem.acquire().await;
                    let data = std::fs::read(&f).expect("read");
                    c.put_object()
                        .bucket(&b)
                        .key(&key)
                        .body(data.into())
                        .customize()
                        .disable_payload_signing()
                        .send()
                        .await
                        .expect("PUT");
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
            println!("{:.3}", start.elapsed().as_secs_f64());
            return;
        }
        "count" => {
            let prefix = arg(&args, 4);
            let mut n = 0;
            let mut token = None;
            loop {
                let out = c
                    .list_objects_v2()
                    .bucket(&bucket)
                    .prefix(&prefix)
                    .set_continuation_token(token)
                    .send()
                    .await
                    .expect("LIST");
                n += out.contents().len();
                token = out.next_continuation_token().map(str::to_string);
                if token.is_none() {
                    break;
                }
            }
            println!("{n}");
            return;
        }
        "head" => {
            let key = arg(&args, 4);
            let size = match c.head_object().bucket(&bucket).key(&key).send().await {
                Ok(o) => o.content_length().unwrap_or(0),
                Err(_) => -1,
            };
            println!("{size}");
            return;
        }
        "etag" => {
            let key = arg(&args, 4);
            let etag = match c.head_object().bucket(&bucket).key(&key).send().await {
                Ok(o) => o.e_tag().unwrap_or_default().to_string(),
                Err(_) => String::new(),
            };
            println!("{etag}");
            return;
        }
        "make-bucket" => {
            // A bucket kept from an earlier run (the memory walk's) is there already.
            if let Err(e) = c.create_bucket().bucket(&bucket).send().await {
                let owned = e.as_service_error().is_some_and(|s| {
                    s.is_bucket_already_owned_by_you() || s.is_bucket_already_exists()
                });
                if !owned {
                    panic!("CreateBucket: {e:?}");
                }
            }
            return;
        }
        "drop-bucket" => {
            loop {
                let page = c
                    .list_objects_v2()
                    .bucket(&bucket)
                    .send()
                    .await
                    .expect("list");
                if page.contents().is_empty() {
                    break;
                }
                for o in page.contents() {
                    c.delete_object()
                        .bucket(&bucket)
                        .key(o.key().unwrap_or_default())
                        .send()
                        .await
                        .expect("delete");
                }
            }
            let ups = c
                .list_multipart_uploads()
                .bucket(&bucket)
                .send()
                .await
                .expect("list uploads");
            for u in ups.uploads() {
                c.abort_multipart_upload()
                    .bucket(&bucket)
                    .key(u.key().unwrap_or_default())
                    .upload_id(u.upload_id().unwrap_or_default())
                    .send()
                    .await
                    .expect("abort");
            }
            c.delete_bucket()
                .bucket(&bucket)
                .send()
                .await
                .expect("DeleteBucket");
            return;
        }
        "put-tree" => {
            let prefix = arg(&args, 4);
            let dirs: usize = arg(&args, 5).parse().expect("dirs");
            let per_dir: usize = arg(&args, 6).parse().expect("files per dir");
            let streams: usize = arg(&args, 7).parse().expect("streams");
            let _ = c.create_bucket().bucket(&bucket).send().await;
            // At most `streams` requests (and tasks) at once, however many files.
            let sem = Arc::new(Semaphore::new(streams));
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..dirs * per_dir {
                let permit = sem.clone().acquire_owned().await.expect("semaphore");
                let (c, b) = (c.clone(), bucket.clone());
                let key = format!("{prefix}d{:04}/f{:05}", i / per_dir, i % per_dir);
                tasks.spawn(async move {
                    let _p = permit;
                    c.put_object()
                        .bucket(&b)
                        .key(&key)
                        .body(vec![b'x'].into())
                        .send()
                        .await
                        .expect("PUT");
                });
                while let Some(done) = tasks.try_join_next() {
                    done.expect("task");
                }
            }
            while let Some(done) = tasks.join_next().await {
                done.expect("task");
            }
            return;
        }
        "put-files" => {
            let prefix = arg(&args, 4);
            let count: usize = arg(&args, 5).parse().expect("count");
            let size: usize = arg(&args, 6).parse().expect("size");
            let streams: usize = arg(&args, 7).parse().expect("streams");
            let _ = c.create_bucket().bucket(&bucket).send().await;
            let sem = Arc::new(Semaphore::new(streams));
            let mut tasks = Vec::new();
            for i in 0..count {
                let (c, b, sem) = (c.clone(), bucket.clone(), sem.clone());
                let key = format!("{prefix}{i:05}.bin");
                let data = pseudo_random(size, i as u64 + 2);
                tasks.push(tokio::spawn(async move {
                    let _p = sem.acquire().await;
                    c.put_object()
                        .bucket(&b)
                        .key(&key)
                        .body(data.into())
                        .send()
                        .await
                        .expect("PUT");
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
            return;
        }
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2)
        }
    };
    let secs = start.elapsed().as_secs_f64();
    println!("{:.1}", total as f64 / (1 << 20) as f64 / secs);
}

fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}
