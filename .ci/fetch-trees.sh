#!/usr/bin/env bash
# Fetches the ComfyUI trees the pack is tested against from their public git repositories, for a contributor who
# cloned the pack alone (no ../shared/comfyui/lay-out.sh beside the checkout): the same commits lay-out.sh lays out,
#   DEST/v0.33         ComfyUI 0.33.0, 783545f (2026-08-22)      comfyanonymous/ComfyUI
#   DEST/v0.27         ComfyUI 0.27.0, bb131be (tag v0.27.0)     comfyanonymous/ComfyUI
#   DEST/v0.3.64       ComfyUI 0.3.64, a125cd8 (2025-10-11)      comfyanonymous/ComfyUI
#   DEST/ComfyUI-GGUF  795e451 (2025-12-18)                      city96/ComfyUI-GGUF
#   DEST/raylight      c049571 (2026-06-12)                      komikndr/raylight
# Usage: bash .ci/fetch-trees.sh DEST. The repositories come from COMFYUI_GIT_URL, COMFYUI_GGUF_GIT_URL and
# RAYLIGHT_GIT_URL (default: GitHub; a file:// URL of a local mirror works too, which is how tests/test_ci_run.py
# tests this without a network). Idempotent: a tree already fetched at its commit is kept (DEST/<name>/.laid).
# Each commit is fetched alone (depth 1): its trees first, then its files; a file the remote does not have (a git
# mirror that leaves its largest files out) is left out and named in .laid, as lay-out.sh does.
set -u
DEST=${1:?usage: bash .ci/fetch-trees.sh DEST}
COMFYUI_GIT_URL=${COMFYUI_GIT_URL:-https://github.com/comfyanonymous/ComfyUI}
COMFYUI_GGUF_GIT_URL=${COMFYUI_GGUF_GIT_URL:-https://github.com/city96/ComfyUI-GGUF}
RAYLIGHT_GIT_URL=${RAYLIGHT_GIT_URL:-https://github.com/komikndr/raylight}
# a local remote serves commits and files by id only when asked (GitHub does it for reachable objects)
UPLOAD_PACK="git -c uploadpack.allowFilter=true -c uploadpack.allowAnySHA1InWant=true upload-pack"
mkdir -p "$DEST/.git-cache" || exit 1
rc=0

fetch_tree() {  # name url commit
  local name=$1 url=$2 ref=$3 out=$DEST/$1 g=$DEST/.git-cache/$1.git
  if [ -f "$out/.laid" ] && head -1 "$out/.laid" | grep -q "$ref"; then echo "$name: $out (already fetched)"; return 0; fi
  rm -rf "$g"; git init -q --bare "$g" || { rc=1; return 1; }
  local f=(--git-dir="$g" fetch -q --no-tags --depth 1 --upload-pack="$UPLOAD_PACK")
  if ! git "${f[@]}" "$url" "$ref" 2>/dev/null; then
    # the commit and its trees without their files, then the files; a remote that lacks some files answers
    # "not our ref <id>" for the first one: leave it out and ask again for the rest
    git "${f[@]}" --filter=blob:none "$url" "$ref" || { echo "$name: cannot fetch $ref from $url"; rc=1; return 1; }
    local want absent=() bad out_
    want=$(git --git-dir="$g" rev-list --objects --missing=print "$ref" | sed -n 's/^?//p')
    while [ -n "$want" ]; do
      if out_=$(printf '%s\n' "$want" | git --git-dir="$g" fetch -q --no-tags --no-write-fetch-head \
          --upload-pack="$UPLOAD_PACK" "$url" --stdin 2>&1); then break; fi
      bad=$(printf '%s\n' "$out_" | grep -o 'not our ref [0-9a-f]*' | head -1 | awk '{print $4}')
      [ -n "$bad" ] || { echo "$name: cannot fetch the files of $ref from $url: $out_"; rc=1; return 1; }
      absent+=("$bad")
      want=$(printf '%s\n' "$want" | grep -v "^$bad\$" || true)
    done
  fi
  # no lazy fetches from here on (a file left out stays out)
  git --git-dir="$g" config --remove-section "remote.$url" 2>/dev/null || true
  local ex=() sha path
  for sha in $(git --git-dir="$g" rev-list --objects --missing=print "$ref" | sed -n 's/^?//p'); do
    path=$(git --git-dir="$g" ls-tree -r "$ref" | awk -v s="$sha" '$3 == s {print $4; exit}')
    ex+=(":(exclude)$path")
  done
  rm -rf "$out.part"; mkdir -p "$out.part"
  git --git-dir="$g" archive "$ref" -- . "${ex[@]}" 2>/dev/null | tar -x -C "$out.part" \
    || { echo "$name: could not write $ref"; rm -rf "$out.part"; rc=1; return 1; }
  { echo "$url $ref"; for e in "${ex[@]}"; do echo "absent: ${e#:(exclude)}"; done; } > "$out.part/.laid"
  rm -rf "$out"; mv "$out.part" "$out"
  echo "$name: $out from $url (${#ex[@]} files absent)"
}

fetch_tree v0.33 "$COMFYUI_GIT_URL" 783545f689a0af730065994b46b382ae24844c99
fetch_tree v0.27 "$COMFYUI_GIT_URL" bb131be9e83d2f773c90f1d6f1e4b248a498c8c5
fetch_tree v0.3.64 "$COMFYUI_GIT_URL" a125cd84b054a57729b5eecab930ca9408719832
fetch_tree ComfyUI-GGUF "$COMFYUI_GGUF_GIT_URL" 795e45156ece99afbc3efef911e63fcb46e6a20d
fetch_tree raylight "$RAYLIGHT_GIT_URL" c0495710d960c413443727b5c640e22d6bd9ef61
exit $rc
