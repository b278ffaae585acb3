#!/usr/bin/env bash
# A file larger than one transfer to the GPU machine travels in parts.
#   parts.sh split FILE [BYTES]   (build machine) FILE -> devpack/NAME.part00, .part01, ...
#                                 (BYTES each, default 50,000,000) and devpack/NAME.md5
#   parts.sh keep                 (GPU machine) moves the devpack/*.part* and *.md5 that
#                                 came with this transfer into /tmp/parts
#   parts.sh join NAME OUT        (GPU machine) /tmp/parts/NAME.part* -> OUT, checked
#                                 against NAME.md5
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  split)
    name=$(basename "$2"); mkdir -p devpack
    split -b "${3:-50000000}" -d "$2" "devpack/$name.part"
    (cd "$(dirname "$2")" && md5sum "$name") > "devpack/$name.md5"
    ls -l devpack/"$name".* ;;
  keep)
    mkdir -p /tmp/parts
    for f in devpack/*.part* devpack/*.md5; do [ -f "$f" ] && cp "$f" /tmp/parts/; done
    ls -l /tmp/parts ;;
  join)
    cat /tmp/parts/"$2".part* > "$3"
    (cd /tmp/parts && sed "s|  $2\$|  $3|" "$2.md5" | md5sum -c -) ;;
  *) echo "usage: parts.sh split FILE [BYTES] | keep | join NAME OUT" >&2; exit 2 ;;
esac
