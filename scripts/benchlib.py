"""Shared pieces of the benchmarks: ports, the SDK baseline binary, mounts, fio, the servers."""
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")
# The daemon the mounts run: this checkout's build, or another build to compare with
# (S3RDMA_BENCH_DAEMON=/path/to/s3rdma: the same rows, a binary built from another commit).
DAEMON = os.environ.get("S3RDMA_BENCH_DAEMON") or os.path.join(BIN, "s3rdma")
KEY, SECRET = "s3rdmatest", "s3rdmatestsecret"
ENV = dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_EC2_METADATA_DISABLED="true")


def free_base(n):
    for _ in range(200):
        base = random.randrange(12000, 32000)  # below the ephemeral range
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            pass
        finally:
            for s in socks:
                s.close()
    sys.exit("bench: no free ports")


def wait_port(port, limit=60):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"bench: nothing listens on {port}")


def sdk(*args):
    out = subprocess.run([os.path.join(BIN, "examples", "sdk_bench"), *map(str, args)], env=ENV,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"bench: sdk_bench {args}: {out.stderr}")
    return float(out.stdout.strip() or 0)


def sdk_text(*args):
    """sdk_bench's one line of output, as text."""
    out = subprocess.run([os.path.join(BIN, "examples", "sdk_bench"), *map(str, args)], env=ENV,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"bench: sdk_bench {args}: {out.stderr}")
    return out.stdout.strip()


def is_mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(l.split(" ")[4] == path for l in f)


class Mount:
    def __init__(self, endpoint, bucket, extra, work):
        self.path = tempfile.mkdtemp(dir=work, prefix="mnt-")
        cmd = [DAEMON, bucket, self.path, "--endpoint-url", endpoint, "--force-path-style",
               "--log-level", "warn", "--log-file", self.path + ".log", *extra]
        r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            sys.exit(f"bench: mount failed: {r.stderr}")

    def pid(self):
        """The daemon serving this mount."""
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        args = f.read().split(b"\0")
                except OSError:
                    continue
                if args and args[0].endswith(b"s3rdma") and self.path.encode() in args:
                    return int(d)
        sys.exit(f"bench: no daemon for {self.path}")

    def __enter__(self):
        return self

    def __exit__(self, *a):
        subprocess.run(["umount", self.path], check=False)
        deadline = time.time() + 30
        while is_mounted(self.path) and time.time() < deadline:
            time.sleep(0.1)
        shutil.rmtree(self.path, ignore_errors=True)


def fio(args):
    out = subprocess.run(["fio", "--output-format=terse", "--terse-version=3", *args], capture_output=True,
                         text=True, timeout=900)
    if out.returncode != 0:
        first = next((l for l in out.stderr.splitlines() if l.strip()), "")
        raise RuntimeError(f"fio failed: {first.strip()}")
    total = 0.0
    for line in out.stdout.strip().splitlines():
        f = line.split(";")
        total += float(f[6]) + float(f[47])  # read + write bandwidth, KiB/s
    return total / 1024


def median(xs):
    return statistics.median(xs), (max(xs) - min(xs)) / 2 if len(xs) > 1 else 0.0




def build():
    for tool in ("fio", "umount"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} not found (apt-get install fio)")
    subprocess.run(["cargo", "build", "--workspace", "--release", "--locked", "--all-targets"], cwd=ROOT, check=True)


class Servers:
    """SeaweedFS and the loopback RDMA endpoint in front of it, in `work`, on free ports."""

    def __init__(self, work, data=None):
        """`data`: SeaweedFS's data directory (default: inside `work`, gone with it); a
        directory kept between runs keeps its buckets."""
        self.procs = []
        port, ep_port = free_base(8), free_base(1)
        self.endpoint, self.rdma_endpoint = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ep_port}"
        log = open(os.path.join(work, "weed.log"), "a")
        self.procs.append(subprocess.Popen([os.path.join(ROOT, "scripts", "seaweed.sh"), data or os.path.join(work, "srv"), str(port)],
                                           stdout=log, stderr=log))
        wait_port(port)
        eplog = open(os.path.join(work, "endpoint.log"), "a")
        self.procs.append(subprocess.Popen([os.path.join(BIN, "s3rdma-endpoint"), "--listen", f"127.0.0.1:{ep_port}",
                                            "--backend", self.endpoint, "--log-level", "warn"], env=ENV,
                                           stdout=eplog, stderr=eplog))
        wait_port(ep_port)

    def make_bucket(self, bucket):
        """Create `bucket`, waiting for the server to accept requests."""
        for _ in range(120):
            try:
                sdk(self.endpoint, bucket, "make-bucket")
                return
            except SystemExit:
                time.sleep(0.5)
        sys.exit(f"bench: cannot create bucket {bucket}")

    def stop(self):
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def proc_usage(pid):
    """(peak RSS MiB, CPU seconds) of a process so far."""
    with open(f"/proc/{pid}/status") as f:
        hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return hwm / 1024, (int(fields[11]) + int(fields[12])) / ticks
