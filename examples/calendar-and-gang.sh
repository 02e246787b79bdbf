#!/usr/bin/env bash
# A 3-node training run on one fabric, booked for tomorrow, and repaired when a GPU fails.
# Run it in an empty folder: it makes its own database there.
set -euo pipefail
export BETTER_COMPUTE_DB=${BETTER_COMPUTE_DB:-example.db}
here=$(dirname "$0")

better-compute init --force
better-compute inventory import "$here/inventory.json"
better-compute --json preview --tenant acme --pool west --gpus 8 --gang 3 --topology-key fabric.domain --for 3d
run=$(better-compute --json reserve --tenant acme --pool west --gpus 8 --gang 3 \
      --topology-key fabric.domain --for 3d --start +1d --key pretrain-7 |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
better-compute get "$run"
# A GPU under the booking fails: BookingRepair moves that member to a healthy node of the same
# fabric (or the whole gang to another fabric when this one has no room), same window.
node=$(better-compute --json get "$run" | python3 -c 'import json,sys; print(json.load(sys.stdin)["allocations"][0]["nodeId"])')
better-compute device quarantine "$node:0" --reason xid-79
better-compute repair "$run"
better-compute events --reservation "$run"
better-compute timeline --pool west --step 360 --to +2d
