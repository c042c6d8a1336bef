#!/bin/sh
# meson install script: puts the example configs into SYSCONFDIR/dblp unless
# a file of that name is already there (an edited config is never
# overwritten; the pristine copies are in DATADIR/dblp/examples).
# Usage (from deploy/meson.build): install-config.sh SRC_DIR SYSCONFDIR FILE...
set -eu
src=$1
etc=${DESTDIR:-}$2/dblp
shift 2
install -d -m 755 "$etc"
for f in "$@"; do
  if [ -e "$etc/$f" ]; then
    echo "dblp: keeping $etc/$f (the new example is in the examples dir)"
  else
    install -m 644 "$src/$f" "$etc/$f"
    echo "dblp: installed $etc/$f"
  fi
done
