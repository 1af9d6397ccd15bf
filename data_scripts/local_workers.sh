#!/usr/bin/env bash
# Runs K t2t-lite-trainer workers on this machine as one tf.distribute cluster
# (MultiWorkerMirroredStrategy over TF_CONFIG on 127.0.0.1), to try the cluster path.
# Usage: local_workers.sh K [t2t-lite-trainer flags...]
#   e.g. local_workers.sh 2 --data_dir=data/multi30k_ende --output_dir=runs/two_workers \
#          --hparams_set=transformer_tiny --train_steps=10
# Worker 0 is the chief: it alone writes checkpoints and summaries. Logs: OUTPUT_DIR/worker-I.log
set -euo pipefail
workers=${1:?usage: local_workers.sh K [trainer flags...]}
shift
output_dir=$(printf '%s\n' "$@" | sed -n 's/^--output_dir=//p' | tail -n 1)
[ -n "$output_dir" ] || { echo "local_workers.sh: pass --output_dir=..." >&2; exit 2; }
mkdir -p "$output_dir"
ports=$(python3 - "$workers" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)
cluster=$(printf '"127.0.0.1:%s",' $ports)
cluster="[${cluster%,}]"
pids=()
for ((i = 0; i < workers; i++)); do
  TF_CONFIG="{\"cluster\": {\"worker\": $cluster}, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
    t2t-lite-trainer --strategy=multi_worker "$@" > "$output_dir/worker-$i.log" 2>&1 &
  pids+=($!)
done
status=0
for ((i = 0; i < workers; i++)); do
  if ! wait "${pids[$i]}"; then
    echo "worker $i failed; see $output_dir/worker-$i.log" >&2
    status=1
  fi
done
[ $status -eq 0 ] && tail -n 3 "$output_dir/worker-0.log"
exit $status
