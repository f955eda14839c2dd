# shellcheck shell=bash
# shellcheck disable=SC2034,SC2153  # IMAGE_ID is read by plan.sh; knobs assigned by name in settings.sh
# The serving image on every node: built on the head when missing, streamed from the head
# to a worker that lacks it, and the same image ID everywhere before anything starts.

# Sets REPLY to IMAGE's ID on node INDEX; fails when the node does not have it.
image_id_on() {
  local index=$1 image=$2
  image_id_argv "${image}"
  REPLY=$(on_node "${index}" "${CMD[@]}" 2>/dev/null) && [[ ${REPLY} == sha256:* ]]
}

build_chain_on_head() {
  local build_script=${ROOT_DIR}/scripts/build.sh
  [[ ${IMAGE} == "${CHAIN_IMAGE}" ]] \
    || refuse IMAGE "${IMAGE}" "not on the head, and scripts/build.sh builds ${CHAIN_IMAGE} only; accepted: an image present on the head, or ${CHAIN_IMAGE}"
  if ! image_id_on 0 "${BASE_IMAGE}"; then
    refuse BASE_IMAGE "${BASE_IMAGE}" "not on the head, so ${CHAIN_IMAGE} cannot be built; docker pull or docker load it (the vendor image the chain starts from is ${FORK_IMAGE}), or set BASE_IMAGE to a base you have (passed to scripts/build.sh --base)"
  fi
  [[ -x ${build_script} ]] || die "${IMAGE} is missing and ${build_script} is not there to build it"
  say "${IMAGE} is not on the head: building the image chain from ${BASE_IMAGE}"
  "${build_script}" --base "${BASE_IMAGE}" --to v11 || die "scripts/build.sh failed; nothing was started"
}

# The progress meter between `docker save` and the worker: pv when installed, else ours.
meter_argv() {
  local label=$1 size=$2
  if command -v pv >/dev/null; then
    METER_ARGV=(pv --size "${size}" --name "${label}")
  else
    METER_ARGV=(python3 "${LAUNCHER_DIR}/count_bytes.py" "${label}" "${size}")
  fi
}

stream_image_to() {
  local index=$1 size
  node_label "${index}"
  size=$(docker image inspect --format '{{.Size}}' "${IMAGE}")
  meter_argv "${IMAGE} to ${NODE_LIST[index]}" "${size}"
  say "streaming ${IMAGE} to ${REPLY} (docker save | ssh docker load)"
  node_argv "${index}" docker load
  docker save "${IMAGE}" | "${METER_ARGV[@]}" | "${NODE_ARGV[@]}" >/dev/null \
    || die "streaming ${IMAGE} to ${NODE_LIST[index]} failed; nothing was started"
}

ensure_images() {
  local index head_id
  if ! image_id_on 0 "${IMAGE}"; then
    build_chain_on_head
    image_id_on 0 "${IMAGE}" || die "scripts/build.sh finished but ${IMAGE} is still not on the head"
  fi
  head_id=${REPLY}
  for ((index = 1; index < ${#NODE_LIST[@]}; index++)); do
    if ! image_id_on "${index}" "${IMAGE}"; then
      stream_image_to "${index}"
      image_id_on "${index}" "${IMAGE}" || die "${IMAGE} is still missing on ${NODE_LIST[index]} after streaming"
    fi
    [[ ${REPLY} == "${head_id}" ]] \
      || refuse IMAGE "${IMAGE}" "on ${NODE_LIST[index]} it is ${REPLY}, on the head ${head_id}; accepted: one image ID on every node (docker rmi it on ${NODE_LIST[index]} and rerun to stream the head's)"
  done
  IMAGE_ID=${head_id}
}

# DRY_RUN: the image commands, the conditional ones under a comment saying when.
show_images() {
  local index
  printf '# image: %s must exist on the head (built by scripts/build.sh from %s when missing) and have the head'"'"'s ID on every worker (streamed when missing)\n' \
    "${IMAGE}" "${BASE_IMAGE}"
  image_id_argv "${IMAGE}"
  show_on_node 0 "${CMD[@]}"
  printf '# only when %s is missing on the head:\n' "${IMAGE}"
  image_id_argv "${BASE_IMAGE}"
  show_on_node 0 "${CMD[@]}"
  quote_words "${ROOT_DIR}/scripts/build.sh" --base "${BASE_IMAGE}" --to v11
  printf '%s\n' "${REPLY}"
  for ((index = 1; index < ${#NODE_LIST[@]}; index++)); do
    image_id_argv "${IMAGE}"
    show_on_node "${index}" "${CMD[@]}"
    printf '# only when %s is missing on %s:\n' "${IMAGE}" "${NODE_LIST[index]}"
    meter_argv "${IMAGE} to ${NODE_LIST[index]}" '<image-bytes>'
    quote_words "${METER_ARGV[@]}"
    local meter=${REPLY}
    node_argv "${index}" docker load
    quote_words "${NODE_ARGV[@]}"
    printf 'docker save %s | %s | %s\n' "${IMAGE}" "${meter}" "${REPLY}"
  done
}
