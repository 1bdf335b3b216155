#!/usr/bin/env bash
# Issue 29's check on an emulated 4-GPU cluster: serve, list, ramp 1x -> 6x -> 1x of one
# replica's capacity for DURATION s (default 180), print the load JSON, stop everything.
# TRAINING (default 4) checkpointable training jobs start first and fill the GPUs; at the end
# the script prints how many of them were checkpointed and how many of those run again.
#   flock /tmp/miso-heavy.lock timeout 900 bash benchmarks/serve/live_check.sh [DURATION] [PLOT]
set -euo pipefail
DURATION=${1:-180}
PLOT=${2:-}
export HOME; HOME=$(mktemp -d); unset MISO_STATE_DIR MISO_URL MISO_TOKEN
trap 'miso cluster down >/dev/null 2>&1 || true; rm -rf "$HOME"' EXIT
TRAINING=${TRAINING:-4}
miso cluster up --emulated --gpus 4 >/dev/null
for i in $(seq "$TRAINING"); do
  miso submit --name "train$i" -- python -m miso.emuworkload --workload resnet_train128 \
    --iterations 1000000 --ips 40 >/dev/null
done
for _ in $(seq 120); do
  [ "$(miso status --json | python -c '
import json, sys
print(sum(j["state"] == "running" for j in json.load(sys.stdin)["jobs"]))')" -ge "$TRAINING" ] && break
  sleep 1
done
miso serve bars-svc --model resnet50 --slo-p99-ms 100 -- python -m miso.emuserve --model resnet50
URL=
for _ in $(seq 120); do
  URL=$(miso services --json | python -c '
import json, sys
d = json.load(sys.stdin)
s = [x for x in d["services"] if x["name"] == "bars-svc" and x["ready_replicas"] > 0]
print(s[0]["url"] if s else "")')
  [ -n "$URL" ] && break
  sleep 1
done
[ -n "$URL" ] || { echo "bars-svc never got a ready replica" >&2; miso services --json >&2; exit 1; }
miso services --json | python -c 'import json,sys; s=json.load(sys.stdin)["services"][0]; print(json.dumps({k: s[k] for k in ("name","url","ready_replicas","slices","capacity_rps")}))'
miso load "$URL" --ramp 1,6,1 --duration "$DURATION" --json ${PLOT:+--plot "$PLOT"}
miso services --json | python -c 'import json,sys; s=json.load(sys.stdin)["services"][0]; print(json.dumps({"events": [e["text"] for e in s["events"]]}))'
sleep 30  # the training jobs the service's replicas displaced get their slices back
miso status --json | python -c '
import json, sys
jobs = [j for j in json.load(sys.stdin)["jobs"] if j["name"].startswith("train")]
moved = [j for j in jobs if j["restarts"] or j["checkpoint_iteration"]]
print(json.dumps({"training": len(jobs), "training_checkpointed": len(moved),
                  "training_resumed": sum(j["state"] in ("running", "finished") for j in moved),
                  "training_states": [j["state"] for j in jobs]}))'
miso serve --stop bars-svc
