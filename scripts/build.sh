#!/usr/bin/env bash
# Build the image chain v8 -> v9 -> v10 -> v11 (docker/Dockerfile.sm121-v*), in order, each FROM
# the previous tag, starting from the vendor image vllm/vllm-openai:glm53-flash-arm64-cu130 (or
# --base IMAGE).
#
#   scripts/build.sh [--base IMAGE] [--from v8] [--to v11] [--check] [--tag-prefix PREFIX]
#                    [--verbose]
#
#   --base IMAGE        the image the first layer builds on (default: the vendor image for
#                       --from v8, else the previous layer's tag, e.g. PREFIXglm53-sm121-v8)
#   --from, --to        the layers to build (default v8 to v11)
#   --check             print what would be built and what is up to date; build and tag nothing
#   --tag-prefix PREFIX put every tag of the chain under PREFIX (also $GLM53_TAG_PREFIX), e.g.
#                       "test-123-" gives test-123-glm53-sm121-v9; tests use it
#   --verbose           stream docker's build output (it always goes to build/logs/LAYER.log)
#
# Before the layers: the v9 backport is generated (scripts/make-backport, sha256-pinned), the
# base's Python and platform are probed in a throwaway container (--network none), a
# wheelhouse of requirements/tool.txt for that Python is downloaded on the host (cached), and
# the build context is staged in build/context. With v8 in the range, the wheels of v8's pinned
# packages (patches/v8/packages.txt, --require-hashes) are downloaded too (cached) and staged
# with the toolkit in build/context-v8, the context of v8 alone. An image whose glm53.inputs label equals the
# hash of this build's inputs (base image ID, Dockerfile, staged context) is not rebuilt. A
# layer is tagged only after its result, read back from the built image, is applied,
# already-applied or provided-by-base; when a layer fails, its tag and the later layers' tags
# from earlier builds are moved aside to :stale so they cannot pass for this build's result.
#
# Exit: 0 built or up to date; 3 a layer refused (the reason is printed); 1 any other failure;
# 2 usage. Needs a Docker engine, python3 >= 3.10 with pip on the host, and flock.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly REPO_ROOT
readonly LAYERS=(v8 v9 v10 v11)
# The image v8 builds on by default: the vendor's GLM-5.3-Flash image (REFERENCE.md).
readonly VENDOR_IMAGE=vllm/vllm-openai:glm53-flash-arm64-cu130
readonly SM121_PACKAGES_FILE="${REPO_ROOT}/patches/v8/packages.txt"
# Bump when what an image is built from, or how it is labelled, changes outside the hashed
# inputs (build context, Dockerfile, base image ID); it is part of the inputs hash.
readonly SCHEME=glm53-build-2
readonly BUILD_DIR="${REPO_ROOT}/build"
readonly CACHE="${GLM53_RECIPE_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/glm53-recipe}"
readonly PYTHON="${PYTHON:-python3}"
readonly RECORD_DIR=/opt/glm53-recipe/build-record
# The classic builder: it is what Debian's docker.io 20.10 has without buildx, and what the
# chain is tested with.
export DOCKER_BUILDKIT=0

base_ref=""
from_layer=v8
to_layer=v11
check_only=""
verbose=""
tag_prefix="${GLM53_TAG_PREFIX:-}"
step=0
steps=0
summary=()
context_hash=""
context_v8_hash=""
wheelhouse_hash=""
sm121_wheelhouse_dir=""
sm121_wheelhouse_hash=""
backport_sha=""
python_version=""
base_machine=""
base_glibc=""
backport_dir=""
wheelhouse_dir=""
layer_base_ref=""
last_outcome=""

log() { echo "build.sh: $*" >&2; }

die() {
  echo "build.sh: error: $*" >&2
  exit 1
}

usage() {
  sed -n '5,6p' "${BASH_SOURCE[0]}" | sed 's/^#   //' >&2
  exit 2
}

progress() {
  echo "build.sh [${step}/${steps}] $*"
}

next_step() { step=$((step + 1)); }

# One line of the summary: layer, outcome, tag, image ID, what happened.
row() { printf '  %-4s %-17s %-40s %-13s %s' "$1" "$2" "$3" "${4:-}" "${5:-}"; }

layer_index() {
  local i
  for i in "${!LAYERS[@]}"; do
    if [[ "${LAYERS[i]}" == "$1" ]]; then
      echo "${i}"
      return
    fi
  done
  echo "build.sh: error: unknown layer '$1'; layers: ${LAYERS[*]}" >&2
  exit 2
}

tag_of() { echo "${tag_prefix}glm53-sm121-$1"; }

image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }

label_of() {
  docker image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# A hash of every file under DIR: paths, contents and the executable bit. Fails on symlinks.
tree_hash() {
  local dir="$1"
  if [[ -n "$(find "${dir}" -type l -print -quit)" ]]; then
    die "${dir} holds a symlink; the build context must be plain files"
  fi
  (
    cd "${dir}"
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum
    find . -type f -perm -u+x -print0 | LC_ALL=C sort -z | xargs -0 -r printf 'exec %s\n'
  ) | sha256sum | cut -d' ' -f1
}

parse_args() {
  while (($#)); do
    case "$1" in
      --base | --from | --to | --tag-prefix)
        (($# >= 2)) || usage
        case "$1" in
          --base) base_ref="$2" ;;
          --from) from_layer="$2" ;;
          --to) to_layer="$2" ;;
          --tag-prefix) tag_prefix="$2" ;;
        esac
        shift 2
        ;;
      --check) check_only=1 && shift ;;
      --verbose) verbose=1 && shift ;;
      -h | --help) usage ;;
      *)
        echo "build.sh: error: unknown argument '$1'" >&2
        usage
        ;;
    esac
  done
  local from_i to_i
  from_i="$(layer_index "${from_layer}")"
  to_i="$(layer_index "${to_layer}")"
  ((from_i <= to_i)) || die "--from ${from_layer} comes after --to ${to_layer}"
  if [[ -n "${tag_prefix}" && ! "${tag_prefix}" =~ ^[a-z0-9][a-z0-9._/-]*$ ]]; then
    die "--tag-prefix '${tag_prefix}' is not a valid image-name prefix (lowercase, digits, . _ - /)"
  fi
  if [[ -z "${base_ref}" ]]; then
    if ((from_i == 0)); then
      base_ref="${VENDOR_IMAGE}"
    else
      base_ref="$(tag_of "${LAYERS[from_i - 1]}")"
    fi
  fi
  steps=$((4 + to_i - from_i + 1 + (from_i == 0 ? 1 : 0)))
}

check_host() {
  command -v docker >/dev/null || die "docker is not installed on this host"
  docker info >/dev/null 2>&1 \
    || die "no Docker engine answers (docker info failed); start dockerd or check DOCKER_HOST"
  command -v flock >/dev/null || die "flock is missing; install util-linux"
  "${PYTHON}" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null \
    || die "${PYTHON} is not Python >= 3.10 (make-backport and pip run on the host); set PYTHON"
}

# The v9 diffs (DFlash2 per base shape, the draft-noise salt per salt shape; the layer's probe
# picks them in the image), generated from
# the pinned vLLM releases and checked against the manifest's pins.
prepare_backport() {
  next_step
  local manifest="${REPO_ROOT}/patches/v9/manifest.json" pins out shape pin
  pins="$("${PYTHON}" -c 'import json, sys
manifest = json.load(open(sys.argv[1]))
for shape, pin in sorted(manifest["diff_sha256"].items()):
    print(f"dflash2-{shape}", pin)
for shape, pin in sorted(manifest["draft_noise_salt"]["diff_sha256"].items()):
    print(f"draft-noise-salt-{shape}", pin)' "${manifest}")" \
    || die "${manifest}: no diff_sha256; see scripts/make-backport"
  backport_sha="$(sha256sum <<<"${pins}" | cut -d' ' -f1)"
  out="${BUILD_DIR}/backport/${backport_sha:0:16}"
  local cached=1
  while read -r shape pin; do
    [[ -f "${out}/${shape}.diff" && "$(sha256_of "${out}/${shape}.diff")" == "${pin}" ]] \
      || cached=""
  done <<<"${pins}"
  if [[ -n "${cached}" ]]; then
    progress "backport: ${out#"${REPO_ROOT}"/} (cached, $(wc -l <<<"${pins}") diffs)"
  else
    rm -rf "${out}.tmp"
    "${PYTHON}" "${REPO_ROOT}/scripts/make-backport" --out-dir "${out}.tmp" >&2 \
      || die "scripts/make-backport failed (output above); nothing was built"
    while read -r shape pin; do
      [[ "$(sha256_of "${out}.tmp/${shape}.diff")" == "${pin}" ]] \
        || die "${out}.tmp/${shape}.diff: sha256 differs from ${manifest}'s pin; nothing was built"
    done <<<"${pins}"
    rm -rf "${out}"
    mv "${out}.tmp" "${out}"
    progress "backport: ${out#"${REPO_ROOT}"/} (generated, $(wc -l <<<"${pins}") diffs)"
  fi
  backport_dir="${out}"
}

# Python version, machine and glibc of the base, from a throwaway container (cached by ID).
probe_base() {
  next_step
  local base_id="$1" cache="${BUILD_DIR}/probe/${1#sha256:}" probe
  if [[ -s "${cache}" ]]; then
    probe="$(<"${cache}")"
  else
    probe="$(docker run --rm --network none --entrypoint python3 "${base_id}" -c \
      'import os, platform, sys; print("%d.%d" % sys.version_info[:2], platform.machine(), os.confstr("CS_GNU_LIBC_VERSION").split()[-1])' \
      2>&1)" || die "${base_ref}: python3 -c ... failed in a container of the base: ${probe}"
    mkdir -p "${BUILD_DIR}/probe"
    echo "${probe}" >"${cache}"
  fi
  read -r python_version base_machine base_glibc <<<"${probe}"
  [[ "${python_version}" =~ ^3\.[0-9]+$ && "${base_glibc}" =~ ^2\.[0-9]+$ ]] \
    || die "${base_ref}: unexpected probe result '${probe}' (want 'X.Y MACHINE GLIBC'); delete ${cache}"
  [[ "$(printf '%s\n' 3.10 "${python_version}" | sort -V | head -n1)" == 3.10 ]] \
    || die "${base_ref} has Python ${python_version}; the layer tool needs >= 3.10"
  progress "base: ${base_ref} (${base_id:7:12}): Python ${python_version}, ${base_machine}, glibc ${base_glibc}"
}

# pip's --platform flags for every manylinux tag the base's glibc runs, into PLATFORMS.
manylinux_platforms() {
  local minor=${base_glibc#2.} n
  PLATFORMS=()
  for ((n = 5; n <= minor; n++)); do
    PLATFORMS+=(--platform "manylinux_2_${n}_${base_machine}")
  done
  PLATFORMS+=(--platform "manylinux2014_${base_machine}" --platform "manylinux2010_${base_machine}"
    --platform "manylinux1_${base_machine}")
}

# requirements/tool.txt as wheels for the base's Python and platform, downloaded on the host
# once (the containers reach no registry); GLM53_WHEELHOUSE names a ready-made one instead.
prepare_wheelhouse() {
  next_step
  local tool="${REPO_ROOT}/requirements/tool.txt" key dir
  if [[ -n "${GLM53_WHEELHOUSE:-}" ]]; then
    compgen -G "${GLM53_WHEELHOUSE}/*.whl" >/dev/null \
      || die "GLM53_WHEELHOUSE=${GLM53_WHEELHOUSE} holds no .whl files"
    wheelhouse_dir="${GLM53_WHEELHOUSE}"
    progress "wheelhouse: ${wheelhouse_dir} (GLM53_WHEELHOUSE)"
    return
  fi
  key="cp${python_version/./}-${base_machine}-glibc${base_glibc}-$(sha256_of "${tool}" | cut -c1-12)"
  dir="${CACHE}/wheelhouse/${key}"
  if [[ ! -f "${dir}/.complete" ]]; then
    manylinux_platforms
    rm -rf "${dir}"
    mkdir -p "${dir}"
    "${PYTHON}" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
      --implementation cp --python-version "${python_version}" "${PLATFORMS[@]}" \
      -d "${dir}" -r "${tool}" >&2 \
      || die "pip download of ${tool} for Python ${python_version} ${base_machine} failed (above); PyPI must be reachable from this host, or set GLM53_WHEELHOUSE"
    touch "${dir}/.complete"
    progress "wheelhouse: ${dir} (downloaded)"
  else
    progress "wheelhouse: ${dir} (cached)"
  fi
  wheelhouse_dir="${dir}"
}

# The wheels of v8's pinned packages for the base's Python and platform, downloaded on the host
# once with their sha256 checked against patches/v8/packages.txt (--require-hashes).
prepare_sm121_wheelhouse() {
  next_step
  local key dir index=()
  # The documented alternative pins (FlashInfer's nightly) live on FlashInfer's own index.
  if [[ -n "${GLM53_SM121_EXTRA_INDEX:-}" ]]; then
    index=(--extra-index-url "${GLM53_SM121_EXTRA_INDEX}")
  fi
  key="cp${python_version/./}-${base_machine}-glibc${base_glibc}-$(cat "${SM121_PACKAGES_FILE}" \
    <(echo "${GLM53_SM121_EXTRA_INDEX:-}") | sha256sum | cut -c1-12)"
  dir="${CACHE}/sm121-wheelhouse/${key}"
  if [[ ! -f "${dir}/.complete" ]]; then
    manylinux_platforms
    rm -rf "${dir}"
    mkdir -p "${dir}"
    progress "sm121 packages: downloading the wheels of ${SM121_PACKAGES_FILE#"${REPO_ROOT}"/} for Python ${python_version} ${base_machine} (about 400 MB, once)"
    "${PYTHON}" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
      --require-hashes --implementation cp --python-version "${python_version}" "${PLATFORMS[@]}" \
      "${index[@]}" \
      -d "${dir}" -r "${SM121_PACKAGES_FILE}" >&2 \
      || die "pip download of ${SM121_PACKAGES_FILE} for Python ${python_version} ${base_machine} failed (above); PyPI must be reachable from this host"
    touch "${dir}/.complete"
  fi
  sm121_wheelhouse_dir="${dir}"
  progress "sm121 packages: ${dir} ($(du -sh "${dir}" | cut -f1), $(find "${dir}" -name '*.whl' | wc -l) wheels)"
}

# build/context: exactly what the Dockerfiles COPY, so that its hash is the build's input.
stage_context() {
  next_step
  local staging="${BUILD_DIR}/context.new"
  rm -rf "${staging}"
  mkdir -p "${staging}/docker" "${staging}/requirements" "${staging}/wheelhouse" \
    "${staging}/backport"
  tar -C "${REPO_ROOT}" --exclude=__pycache__ --exclude='*.pyc' -cf - scripts recipekit patches \
    | tar -C "${staging}" -xf -
  cp "${REPO_ROOT}/requirements/tool.txt" "${staging}/requirements/"
  cp "${REPO_ROOT}/docker/apply-layer.py" "${staging}/docker/"
  cp "${wheelhouse_dir}"/*.whl "${staging}/wheelhouse/"
  cp "${backport_dir}"/dflash2-*.diff "${staging}/backport/"
  rm -rf "${BUILD_DIR}/context"
  mv "${staging}" "${BUILD_DIR}/context"
  context_hash="$(tree_hash "${BUILD_DIR}/context")"
  wheelhouse_hash="$(tree_hash "${BUILD_DIR}/context/wheelhouse")"
  progress "context: build/context (sha256 ${context_hash:0:16}, $(du -sh "${BUILD_DIR}/context" | cut -f1))"
  [[ -n "${sm121_wheelhouse_dir}" ]] || return 0
  # v8 alone gets the package wheels: hard links to the cache, so staging copies nothing.
  staging="${BUILD_DIR}/context-v8.new"
  rm -rf "${staging}"
  cp -al "${BUILD_DIR}/context" "${staging}"
  mkdir -p "${staging}/sm121-wheelhouse"
  cp -l "${sm121_wheelhouse_dir}"/*.whl "${staging}/sm121-wheelhouse/" 2>/dev/null \
    || cp "${sm121_wheelhouse_dir}"/*.whl "${staging}/sm121-wheelhouse/"
  rm -rf "${BUILD_DIR}/context-v8"
  mv "${staging}" "${BUILD_DIR}/context-v8"
  context_v8_hash="$(tree_hash "${BUILD_DIR}/context-v8")"
  sm121_wheelhouse_hash="$(tree_hash "${BUILD_DIR}/context-v8/sm121-wheelhouse")"
  progress "context: build/context-v8 (sha256 ${context_v8_hash:0:16}, $(du -sh "${BUILD_DIR}/context-v8" | cut -f1))"
}

# The directory the Dockerfile of LAYER is built from.
context_of() {
  if [[ "$1" == v8 ]]; then
    echo "${BUILD_DIR}/context-v8"
  else
    echo "${BUILD_DIR}/context"
  fi
}

recipe_commit() {
  local commit
  commit="$(git -C "${REPO_ROOT}" rev-parse HEAD 2>/dev/null)" || {
    echo unknown
    return
  }
  if [[ -n "$(git -C "${REPO_ROOT}" status --porcelain -- scripts recipekit patches \
    requirements/tool.txt docker 2>/dev/null)" ]]; then
    commit+="-dirty"
  fi
  echo "${commit}"
}

inputs_hash() {
  local layer="$1" base_id="$2"
  printf '%s\n' "scheme ${SCHEME}" "layer ${layer}" "base ${base_id}" \
    "dockerfile $(sha256_of "${REPO_ROOT}/docker/Dockerfile.sm121-${layer}")" \
    "context $(if [[ "${layer}" == v8 ]]; then echo "${context_v8_hash}"; else echo "${context_hash}"; fi)" \
    | sha256sum | cut -d' ' -f1
}

# The layer's own patch material: its patcher module and its patches/ directory.
patch_hash() {
  local layer="$1"
  {
    sha256sum "${BUILD_DIR}/context/recipekit/layers/${layer}.py" | cut -d' ' -f1
    tree_hash "${BUILD_DIR}/context/patches/${layer}"
    # v8's changes live in its sm121_* modules beside it.
    if [[ "${layer}" == v8 ]]; then
      cat "${BUILD_DIR}"/context/recipekit/layers/sm121_*.py | sha256sum | cut -d' ' -f1
    fi
  } | sha256sum | cut -d' ' -f1
}

# Moves the tags of LAYER and every later layer aside (to :stale), so that an image of an
# earlier build is never taken for the result of this one.
move_aside_from() {
  local i tag
  for ((i = $(layer_index "$1"); i < ${#LAYERS[@]}; i++)); do
    tag="$(tag_of "${LAYERS[i]}")"
    if [[ -n "$(image_id "${tag}")" ]]; then
      docker tag "${tag}" "${tag}:stale"
      docker rmi "${tag}" >/dev/null
      log "moved the earlier ${tag} aside to ${tag}:stale; it is not the result of this build"
    fi
  done
}

# The field NAME of the JSON record read from the image.
record_field() {
  "${PYTHON}" -c '
import json, sys
value = json.loads(sys.argv[1]).get(sys.argv[2], "")
print(",".join(value) if isinstance(value, list) else str(value).splitlines()[0] if value else "")
' "$1" "$2"
}

# A Dockerfile that is FROM IMAGE plus one LABEL instruction with every KEY=VALUE given.
label_dockerfile() {
  local image="$1" pair key value
  shift
  printf 'FROM %s\nLABEL' "${image}"
  for pair in "$@"; do
    key="${pair%%=*}"
    value="${pair#*=}"
    value="${value//\\/\\\\}"
    value="${value//\"/\\\"}"
    value="${value//\$/\\\$}"
    printf ' \\\n  "%s"="%s"' "${key}" "${value}"
  done
  printf '\n'
}

# Builds LAYER on BASE_ID; on success tags it and prints its ID. Returns 3 on a refusal.
build_layer() {
  local layer="$1" base_id="$2" inputs="$3" tag built_id record outcome commit
  local log_file="${BUILD_DIR}/logs/${layer}.log" iid="${BUILD_DIR}/iid/${layer}"
  tag="$(tag_of "${layer}")"
  mkdir -p "${BUILD_DIR}/logs" "${BUILD_DIR}/iid"
  rm -f "${iid}"
  local build=(docker build --network none --force-rm --iidfile "${iid}"
    -f "${REPO_ROOT}/docker/Dockerfile.sm121-${layer}" --build-arg "BASE_IMAGE=${base_id}"
    "$(context_of "${layer}")")
  local status=0
  if [[ -n "${verbose}" ]]; then
    "${build[@]}" 2>&1 | tee "${log_file}" >&2 || status=$?
  else
    "${build[@]}" >"${log_file}" 2>&1 || status=$?
  fi
  if ((status != 0)); then
    if grep -q "REFUSED" "${log_file}"; then
      grep -h "REFUSED\|^patch-layer ${layer}: refused" "${log_file}" | sed 's/^/  /' >&2
      log "${layer}: refused by scripts/patch-layer (full output: ${log_file#"${REPO_ROOT}"/})"
      return 3
    fi
    tail -n 15 "${log_file}" | sed 's/^/  /' >&2
    log "${layer}: docker build failed (full output: ${log_file#"${REPO_ROOT}"/})"
    return 1
  fi
  [[ -s "${iid}" ]] || {
    log "${layer}: docker build wrote no image ID to ${iid}"
    return 1
  }
  built_id="$(<"${iid}")"
  # Until it is labelled, the built image holds a tag of its own, so that whatever prunes
  # untagged images meanwhile (docker image prune, a concurrent test session) leaves it.
  local hold="${tag}:unlabelled-$$"
  docker tag "${built_id}" "${hold}"
  # shellcheck disable=SC2064  # expand hold now; the trap runs when this function returns
  trap "docker rmi '${hold}' >/dev/null 2>&1 || true; trap - RETURN" RETURN
  # The label must say what the build step did: read its record back from the built image.
  record="$(docker run --rm --network none --entrypoint cat "${built_id}" \
    "${RECORD_DIR}/${layer}.json")" || {
    log "${layer}: the built image ${built_id:7:12} has no ${RECORD_DIR}/${layer}.json"
    return 1
  }
  outcome="$(record_field "${record}" outcome)"
  if [[ "$(record_field "${record}" layer)" != "${layer}" ]] \
    || [[ ! " applied already-applied provided-by-base " =~ \ ${outcome}\  ]]; then
    log "${layer}: the built image records layer '$(record_field "${record}" layer)' outcome '${outcome}'; not tagged"
    return 1
  fi
  commit="$(recipe_commit)"
  # glm53.chain lists every layer's outcome, when the base is this chain's previous layer.
  local chain="" index
  index="$(layer_index "${layer}")"
  if ((index > 0)) && [[ "$(label_of "${base_id}" glm53.layer)" == "${LAYERS[index - 1]}" ]]; then
    chain="$(label_of "${base_id}" glm53.chain) "
  fi
  local digest
  digest="$(docker image inspect -f '{{join .RepoDigests " "}}' "${base_id}")"
  local labels=(
    "glm53.scheme=${SCHEME}"
    "glm53.layer=${layer}"
    "glm53.outcome=${outcome}"
    "glm53.files=$(record_field "${record}" files)"
    "glm53.reason=$(record_field "${record}" reason)"
    "glm53.chain=${chain}${layer}=${outcome}"
    "glm53.inputs=${inputs}"
    "glm53.commit=${commit}"
    "org.opencontainers.image.revision=${commit}"
    "glm53.patch.sha256=$(patch_hash "${layer}")"
    "glm53.backport.sha256=${backport_sha}"
    "glm53.wheelhouse.sha256=${wheelhouse_hash}"
    "glm53.base.id=${base_id}"
    "glm53.base.ref=${layer_base_ref}"
    "glm53.base.digest=${digest:-none}"
    "glm53.vllm.root=$(record_field "${record}" vllm_root)"
    "glm53.python=$(record_field "${record}" python)"
  )
  if [[ "${layer}" == v8 ]]; then
    labels+=("glm53.packages=$(record_field "${record}" packages)"
      "glm53.packages.wheelhouse.sha256=${sm121_wheelhouse_hash}")
  fi
  # One LABEL instruction: the classic builder makes a step (a full image copy on vfs) of
  # every --label flag.
  label_dockerfile "${built_id}" "${labels[@]}" \
    | docker build --network none -q -t "${tag}" - >>"${log_file}" 2>&1 || {
    log "${layer}: labelling ${built_id:7:12} as ${tag} failed (see ${log_file#"${REPO_ROOT}"/})"
    return 1
  }
  [[ "$(label_of "${tag}" glm53.inputs)" == "${inputs}" ]] \
    || {
      log "${layer}: ${tag} does not carry this build's inputs label after tagging"
      return 1
    }
  last_outcome="${outcome}"
}

main() {
  parse_args "$@"
  check_host
  mkdir -p "${BUILD_DIR}"
  exec 9>"${BUILD_DIR}/.lock"
  if ! flock -n 9; then
    log "waiting for another scripts/build.sh in this checkout (${BUILD_DIR}/.lock)"
    flock 9
  fi
  local base_id
  base_id="$(image_id "${base_ref}")"
  if [[ -z "${base_id}" ]]; then
    if [[ "${base_ref}" == "${VENDOR_IMAGE}" ]]; then
      die "base image ${base_ref} not found; get the vendor image (docker pull ${VENDOR_IMAGE}, or docker load) or pass --base IMAGE"
    elif [[ "${from_layer}" == v8 ]]; then
      die "base image ${base_ref} not found; pass an image this host has with --base (default: the vendor image ${VENDOR_IMAGE})"
    fi
    local previous="${LAYERS[$(($(layer_index "${from_layer}") - 1))]}"
    die "base image ${base_ref} not found; build it first (scripts/build.sh --to ${previous}) or pass --base IMAGE"
  fi
  prepare_backport
  probe_base "${base_id}"
  prepare_wheelhouse
  if [[ "${from_layer}" == v8 ]]; then
    prepare_sm121_wheelhouse
  fi
  stage_context

  local i layer tag inputs existing started status pending="" failed=""
  local from_i to_i
  from_i="$(layer_index "${from_layer}")"
  to_i="$(layer_index "${to_layer}")"
  layer_base_ref="${base_ref}"
  for ((i = from_i; i <= to_i; i++)); do
    layer="${LAYERS[i]}"
    tag="$(tag_of "${layer}")"
    next_step
    if [[ -n "${pending}" ]]; then
      progress "${layer}: would build ${tag} after ${pending} (its base changes)"
      summary+=("$(row "${layer}" would-build "${tag}")")
      continue
    fi
    inputs="$(inputs_hash "${layer}" "${base_id}")"
    existing="$(image_id "${tag}")"
    if [[ -n "${existing}" && "$(label_of "${tag}" glm53.inputs)" == "${inputs}" \
      && " applied already-applied provided-by-base " =~ \ $(label_of "${tag}" glm53.outcome)\  ]]; then
      progress "${layer}: up to date: ${tag} (${existing:7:12}, $(label_of "${tag}" glm53.outcome), inputs ${inputs:0:12})"
      summary+=("$(row "${layer}" "$(label_of "${tag}" glm53.outcome)" "${tag}" "${existing:7:12}" up-to-date)")
    elif [[ -n "${check_only}" ]]; then
      progress "${layer}: would build ${tag} on ${layer_base_ref} (${base_id:7:12}, inputs ${inputs:0:12}${existing:+; replaces ${existing:7:12}})"
      summary+=("$(row "${layer}" would-build "${tag}")")
      pending="${layer}"
      continue
    else
      progress "${layer}: building ${tag} on ${layer_base_ref} (${base_id:7:12}) ..."
      started=${SECONDS}
      status=0
      build_layer "${layer}" "${base_id}" "${inputs}" || status=$?
      if ((status != 0)); then
        if ((status == 3)); then
          summary+=("$(row "${layer}" refused "(not tagged)" - "$((SECONDS - started)) s")")
        else
          summary+=("$(row "${layer}" failed "(not tagged)" - "$((SECONDS - started)) s")")
        fi
        failed="${layer}"
        move_aside_from "${layer}"
        break
      fi
      existing="$(image_id "${tag}")"
      progress "${layer}: ${last_outcome}: tagged ${tag} (${existing:7:12}, $((SECONDS - started)) s)"
      summary+=("$(row "${layer}" "${last_outcome}" "${tag}" "${existing:7:12}" "built in $((SECONDS - started)) s")")
    fi
    base_id="${existing}"
    layer_base_ref="${tag}"
  done

  echo "build.sh: summary${check_only:+ (--check: nothing was built)}:"
  printf '%s\n' "${summary[@]}"
  if [[ -n "${failed}" ]]; then
    echo "build.sh: FAILED at ${failed}; no tag was applied for ${failed} or any later layer"
    exit "${status}"
  fi
  if [[ -z "${check_only}" && ${to_i} -lt $((${#LAYERS[@]} - 1)) ]]; then
    local later
    for ((i = to_i + 1; i < ${#LAYERS[@]}; i++)); do
      later="$(tag_of "${LAYERS[i]}")"
      if [[ -n "$(image_id "${later}")" \
        && "$(label_of "${later}" glm53.base.id)" != "$(image_id "$(tag_of "${LAYERS[i - 1]}")")" ]]; then
        log "note: ${later} was built on another $(tag_of "${LAYERS[i - 1]}"); rebuild it with --to ${LAYERS[i]}"
      fi
    done
  fi
}

main "$@"
