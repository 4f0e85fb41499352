#!/usr/bin/env bash
# Makes the example profiles under docs/profiles/ (real measurements on this machine's CPU), the report and the
# comparison made from them, and docs/report.png, the screenshot the README shows (headless Chromium).
#   tools/make_docs.sh [build/cpu]      # after `cmake --workflow --preset cpu` (or ci/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/cpu}
memgate="$build/bin/memgate"
out=docs/profiles
mkdir -p "$out"
export MEMGATE_PROGRESS=${MEMGATE_PROGRESS:-1}

for fixture in vit_tiny_full vit_tiny_lora unet_tiny unet_tiny_fp16; do
  "$memgate" profile --config "fixtures/models/$fixture.yaml" --device cpu --output "$out/$fixture.json" >/dev/null
done
# A full-size model: ResNet-18 (the few-shot learner's backbone) at 84x84, batch 1 to 16 (about 3 minutes here).
"$memgate" profile --config fixtures/models/resnet18_fewshot.yaml --device cpu --batch-sizes 1,2,4,8,16 \
  --output "$out/resnet18_fewshot.json" >/dev/null
"$memgate" advise --config fixtures/models/vit_tiny_lora.yaml --device cpu --capacity-mib 4 --effective-batch 32 \
  --output "$out/vit_tiny_lora_advice.json" >/dev/null

"$memgate" report "$out/resnet18_fewshot.json" "$out/vit_tiny_lora_advice.json" --output docs/report.html \
  --title "memgate report: ResNet-18 few-shot learner (CPU), and advice for the tiny LoRA ViT"
"$memgate" compare "$out/vit_tiny_full.json" "$out/vit_tiny_lora.json" --html docs/compare.html >/dev/null

chromium=$(command -v chromium-headless-shell || command -v chromium || true)
if [ -z "$chromium" ]; then
  echo "tools/make_docs.sh: no headless Chromium (apt-get install chromium-headless-shell): no screenshot" >&2
  exit 1
fi
"$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,1500 \
  --screenshot="$PWD/docs/report.png" "file://$PWD/docs/report.html" 2>/dev/null
echo "wrote $out/*.json, docs/report.html, docs/compare.html and docs/report.png"
