"""Checks scrapes of an s3rdma mount's /metrics with Prometheus's own Python parser.

    python3 metrics_check.py [--dashboard FILE] SCRAPE...

SCRAPE files are exposition texts in the order they were scraped. Checked: each parses; every
metric name starts with s3rdma_; labels come from a fixed set of names (no key or path is ever a
label) and their values from fixed sets where the set is known; a histogram's buckets are
cumulative, its +Inf bucket equals its _count; counters and histogram counts never go down
from one scrape to the next. With --dashboard: every s3rdma_* name the dashboard's queries use
exists in the last scrape. Prints `ok N series` or the first problem, exit status 1.
"""
import json
import math
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

LABELS = {"direction", "transport", "operation", "opcode", "errno", "version", "provider",
          "rdma_mode", "bucket", "prefix", "le"}
VALUES = {
    "direction": {"read", "written"},
    "transport": {"http", "rdma"},
    "errno": {"eio", "estale", "enoent", "eacces", "eagain", "etimedout", "other"},
    "rdma_mode": {"off", "auto", "required"},
    "provider": {"loopback", "nvidia"},
    "operation": {"HeadObject", "ListObjectsV2", "GetObject", "PutObject", "CreateMultipartUpload",
                  "UploadPart", "CompleteMultipartUpload", "AbortMultipartUpload", "UploadPartCopy",
                  "CopyObject", "DeleteObject"},
    "opcode": {"lookup", "forget", "getattr", "setattr", "readlink", "symlink", "mkdir", "unlink",
               "rmdir", "rename", "link", "open", "read", "write", "flush", "release", "fsync",
               "opendir", "readdir", "readdirplus", "releasedir", "statfs", "getxattr", "create",
               "other"},
}


def fail(msg):
    print(msg)
    sys.exit(1)


def parse(path):
    text = open(path).read()
    series = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("s3rdma_"):
            fail(f"{path}: metric {fam.name} does not start with s3rdma_")
        hist = {}
        for s in fam.samples:
            for k, v in s.labels.items():
                if k not in LABELS:
                    fail(f"{path}: {s.name} has label {k}={v!r}, not one of the fixed set")
                if k in VALUES and v not in VALUES[k]:
                    fail(f"{path}: {s.name} has {k}={v!r}, not one of {sorted(VALUES[k])}")
            key = (s.name, tuple(sorted(s.labels.items())))
            series[key] = (fam.type, s.value)
            if fam.type == "histogram":
                base = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                h = hist.setdefault(base, {"buckets": []})
                if s.name.endswith("_bucket"):
                    h["buckets"].append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    h["count"] = s.value
        for base, h in hist.items():
            b = h["buckets"]
            if not b or not math.isinf(b[-1][0]):
                fail(f"{path}: {fam.name}{dict(base)} has no +Inf bucket")
            if any(b[i][0] >= b[i + 1][0] or b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
                fail(f"{path}: {fam.name}{dict(base)} buckets are not cumulative: {b}")
            if b[-1][1] != h.get("count"):
                fail(f"{path}: {fam.name}{dict(base)} +Inf bucket {b[-1][1]} != count {h.get('count')}")
    return series


def main(args):
    dashboard = None
    if args[:1] == ["--dashboard"]:
        dashboard, args = args[1], args[2:]
    scrapes = [parse(p) for p in args]
    for i in range(1, len(scrapes)):
        before, now = scrapes[i - 1], scrapes[i]
        for key, (kind, value) in before.items():
            grows = kind == "counter" or (kind == "histogram" and not key[0].endswith("_sum"))
            if grows and key in now and now[key][1] < value:
                fail(f"{args[i]}: {key[0]}{dict(key[1])} went down: {value} -> {now[key][1]}")
    last = scrapes[-1]
    names = {k[0] for k in last}
    if dashboard:
        d = json.load(open(dashboard))
        exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
        exprs += [v.get("query", "") for v in d.get("templating", {}).get("list", [])
                  if isinstance(v.get("query", ""), str)]
        used = {n for e in exprs for n in re.findall(r"\bs3rdma_[a-z0-9_]+", e)}
        missing = sorted(n for n in used if n not in names)
        if missing:
            fail(f"the dashboard queries metrics the exposition does not have: {missing}")
        if not used:
            fail("the dashboard queries no s3rdma metric")
    print(f"ok {len(last)} series")


if __name__ == "__main__":
    main(sys.argv[1:])
