#!/usr/bin/env bash
# commit.sh: prints the commit a benchmark report names: $SPILL_COMMIT when
# set; else git's HEAD, followed by "+modified" when the tracked files
# differ from it (on the GPU machine the work tree is a copy whose git
# metadata can be older than its files: the report must not name a commit
# it did not run); else "unknown".
if [ -n "${SPILL_COMMIT:-}" ]; then
  echo "$SPILL_COMMIT"
  exit 0
fi
head=$(git rev-parse HEAD 2>/dev/null) || { echo unknown; exit 0; }
if git diff --quiet HEAD -- 2>/dev/null; then
  echo "$head"
else
  echo "$head+modified"
fi
