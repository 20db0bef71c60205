#!/usr/bin/env bash
# The demo: start a local S3 server (SeaweedFS, loopback only), fill a bucket, mount it with
# s3rdma, read from it and write to it with plain tools, and check the written bytes directly on
# the server. Cleans up after itself (unmounts, stops the server).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --locked
bin=$PWD/target/release/s3rdma

work=$(mktemp -d /tmp/s3rdma-demo.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
server_pid=
cleanup() {
  if grep -qs " $mnt " /proc/mounts; then umount "$mnt" 2>/dev/null || fusermount3 -u "$mnt" || true; fi
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Eight consecutive free loopback ports for the server.
port=$(python3 - <<'EOF'
import socket, random
for _ in range(200):
    base = random.randrange(12000, 32000)  # below the ephemeral range
    socks = []
    try:
        for p in range(base, base + 8):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
EOF
)
endpoint=http://127.0.0.1:$port
echo "== starting SeaweedFS at $endpoint (log: $work/weed.log)"
scripts/seaweed.sh "$work/server" "$port" >"$work/weed.log" 2>&1 &
server_pid=$!

export AWS_ACCESS_KEY_ID=s3rdmatest AWS_SECRET_ACCESS_KEY=s3rdmatestsecret AWS_EC2_METADATA_DISABLED=true
s3() { curl -sS --fail --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "$@"; }
for _ in $(seq 1 120); do
  if s3 -X PUT "$endpoint/demo" >/dev/null 2>&1; then break; fi
  sleep 0.5
done

echo "== filling bucket 'demo'"
head -c $((64 << 20)) /dev/urandom >"$work/shard-00000.tar"
s3 -T "$work/shard-00000.tar" "$endpoint/demo/datasets/train/shard-00000.tar"
for i in 1 2 3; do
  echo "sample $i" | s3 -T - "$endpoint/demo/datasets/train/labels/sample-$i.txt"
done
s3 -T README.md "$endpoint/demo/docs/README.md"
echo "a file with a space" | s3 -T - "$endpoint/demo/docs/notes%20and%20more.txt"
s3 -X PUT --data-binary "" "$endpoint/demo/checkpoints/"   # a directory marker: an empty directory

echo "== mounting demo at $mnt"
"$bin" demo "$mnt" --endpoint-url "$endpoint" --force-path-style --log-file "$work/s3rdma.log"

echo "== ls -lR $mnt"
ls -lR "$mnt"
echo "== cat $mnt/datasets/train/labels/sample-2.txt"
cat "$mnt/datasets/train/labels/sample-2.txt"
echo "== reading the 64 MiB shard through the mount and comparing checksums"
want=$(sha256sum <"$work/shard-00000.tar" | cut -d' ' -f1)
start=$(date +%s.%N)
got=$(sha256sum <"$mnt/datasets/train/shard-00000.tar" | cut -d' ' -f1)
end=$(date +%s.%N)
echo "local  $want"
echo "mount  $got"
[ "$want" = "$got" ] || { echo "demo: checksum mismatch" >&2; exit 1; }
python3 -c "print('read 64 MiB in %.2f s' % ($end - $start))"

echo "== writing a 200 MiB checkpoint with cp (uploaded in 16 MiB parts while it is written)"
head -c $((200 << 20)) /dev/urandom >"$work/model.pt"
start=$(date +%s.%N)
cp "$work/model.pt" "$mnt/checkpoints/model.pt"
end=$(date +%s.%N)
python3 -c "print('wrote 200 MiB in %.2f s' % ($end - $start))"
echo "run 42: loss 0.173" >"$mnt/checkpoints/train-log.txt"
ls -l "$mnt/checkpoints"
want=$(sha256sum <"$work/model.pt" | cut -d' ' -f1)
via_mount=$(sha256sum <"$mnt/checkpoints/model.pt" | cut -d' ' -f1)
via_server=$(s3 "$endpoint/demo/checkpoints/model.pt" | sha256sum | cut -d' ' -f1)
echo "local   $want"
echo "mount   $via_mount"
echo "server  $via_server"
[ "$want" = "$via_mount" ] && [ "$want" = "$via_server" ] || { echo "demo: written checkpoint differs" >&2; exit 1; }
[ "$(s3 "$endpoint/demo/checkpoints/train-log.txt")" = "run 42: loss 0.173" ] || { echo "demo: train-log.txt differs" >&2; exit 1; }

echo "== rsync -a of a small tree, mv, rm (server-side copy + delete)"
mkdir -p "$work/runs/a/b" && echo one >"$work/runs/a/1.txt" && echo two >"$work/runs/a/b/2.txt"
rsync -a "$work/runs/" "$mnt/runs/"
diff -r "$work/runs" "$mnt/runs" && echo "rsync: identical"
mv "$mnt/checkpoints/model.pt" "$mnt/checkpoints/model-final.pt"
ls -l "$mnt/checkpoints"
[ "$(s3 "$endpoint/demo/checkpoints/model-final.pt" | sha256sum | cut -d' ' -f1)" = "$want" ] || { echo "demo: renamed checkpoint differs" >&2; exit 1; }
rm -r "$mnt/runs"
echo "== unmounting"
umount "$mnt" 2>/dev/null || fusermount3 -u "$mnt"
echo "demo: OK"
