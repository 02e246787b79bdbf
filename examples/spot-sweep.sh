#!/usr/bin/env bash
# Spot sweeps on idle GPUs for a CI principal that may only run spot work; a regular job preempts
# them after the notice; usage bills each side for what it held.
set -euo pipefail
export BETTER_COMPUTE_DB=${BETTER_COMPUTE_DB:-example.db}
here=$(dirname "$0")
at() { echo "2026-09-28T$1:00Z"; }

better-compute --now "$(at 08:00)" init --force
better-compute --now "$(at 08:00)" inventory import "$here/inventory.json"
better-compute meter create gpu.h100.hours
better-compute meter create gpu.h100.spot.hours
better-compute policy set --tenant globex --principal ci-bot --spot-only
for i in 1 2; do
  better-compute --now "$(at 08:00)" --as ci-bot reserve --tenant globex --pool west \
    --gpus 8 --gang 2 --for 12h --spot --key "sweep-$i"
done
better-compute --now "$(at 08:01)" tick
better-compute --now "$(at 08:05)" preview --tenant acme --pool west --gpus 8 --gang 5 --for 6h
better-compute --now "$(at 08:05)" reserve --tenant acme --pool west --gpus 8 --gang 5 --for 6h --key urgent
better-compute --now "$(at 08:10)" tick
better-compute --now "$(at 09:00)" usage
