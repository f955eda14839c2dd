# shellcheck shell=bash
# shellcheck disable=SC2153  # knobs are assigned by name in load_settings (settings.sh)
# Running an argv on a node: the head (node 0) locally, workers through $SSH.
# ssh hands the remote login shell one string, so every word is quoted for it here; the
# quoting is POSIX single-quoting (as Python's shlex.quote), which bash, dash and zsh all
# read back byte for byte, newlines included (printf %q may emit bash-only $'...').

readonly SAFE_WORD_RE='^[A-Za-z0-9_@%+=:,./-]+$'

# Sets REPLY to the words as one shell line.
quote_words() {
  local word line=""
  for word in "$@"; do
    if [[ ${word} =~ ${SAFE_WORD_RE} ]]; then
      line+=" ${word}"
    else
      line+=" '${word//\'/\'\\\'\'}'"
    fi
  done
  REPLY=${line# }
}

# The argv that runs "$@" on node INDEX, into the array NODE_ARGV.
node_argv() {
  local index=$1
  shift
  if ((index == 0)); then
    NODE_ARGV=("$@")
  else
    quote_words "$@"
    NODE_ARGV=("${SSH_WORDS[@]}" "${NODE_LIST[index]}" "${REPLY}")
  fi
}

on_node() {
  node_argv "$@"
  "${NODE_ARGV[@]}"
}

# Prints the command on_node would run, as one shell line.
show_on_node() {
  node_argv "$@"
  quote_words "${NODE_ARGV[@]}"
  printf '%s\n' "${REPLY}"
}

node_label() {
  local index=$1
  if ((index == 0)); then
    REPLY="${NODE_LIST[0]} (head)"
  else
    REPLY="${NODE_LIST[index]} (worker ${index})"
  fi
}
