"""Every knob checked before anything runs; a bad value is refused in one line.

The type of each knob (recipe.toml) gives its check; what a type cannot say is a rule here,
named by the knob's `rule`. First every knob's own value is checked, in the recipe's
order, then the rules that read several knobs (bounds lifted by a FORCE_ knob, the node
list, the managed flags and variables).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher.plan import words as shell_words
from launcher.plan.drafter import Drafter, describe
from launcher.plan.generation import merged_json
from launcher.plan.settings import expand_path, profile_default, refusal, unset_refusal
from recipekit.imagebuild.inputs import dockerfile_of
from recipekit.recipe import Knob, Recipe

_INTEGER = re.compile(r"0|[1-9][0-9]{0,17}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HEX40 = re.compile(r"[0-9a-f]{40}")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*")
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = re.compile(rf"({_OCTET}\.){{3}}{_OCTET}")
_IPV6 = re.compile(r"[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*")
_TP = re.compile(r"[1-9][0-9]{0,3}")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# A name holding one of these would put a credential in `docker inspect`.
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD")
# `vllm serve` flags whose value is a credential, and the setting that carries it instead: a
# flag's value is on every rank's command line (ps, docker inspect) and in DRY_RUN's output.
# tests/vllm/test_api_key_routes.py holds every flag of each pinned vLLM's parser whose name
# suggests a secret to this table or to its list of flags that carry none.
SECRET_FLAGS = {"--api-key": ("API_KEY_FILE", "the API key"),
                "--hf-token": ("HF_TOKEN_FILE", "the Hub token")}
HIDDEN = "<hidden>"
_STOCK_IMAGE = re.compile(r"(docker\.io/)?(library/)?vllm/vllm-openai(:|@|$)")
_MAX_NODES = 16
PATH_ACCEPTED = "accepted: an absolute path (~/ allowed) without commas"
FIXED_PHRASE = "a fixed part of the seed's verified run (recipe.toml, [fixed])"


@dataclass
class Checked:
    """The settings once every check passed: `none` emptied, paths expanded, TP filled."""
    recipe: Recipe
    root: Path
    values: dict[str, str]
    nodes: list[str] = field(default_factory=list)
    words: dict[str, list[str]] = field(default_factory=dict)
    generation_json: str = ""
    drafter: Drafter | None = None

    def __getitem__(self, name: str) -> str:
        return self.values[name]

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1


def _int_check(knob: Knob, value: str) -> None:
    if not _INTEGER.fullmatch(value) or not knob.min <= int(value) <= knob.max:
        why = f"{knob.range_why}; " if knob.range_why else ""
        raise refusal(knob.name, value, f"{why}accepted: an integer {knob.min}..{knob.max}")


def _own_value(checked: Checked, knob: Knob, home: str) -> None:
    """The knob's type check; a path knob's value is expanded here."""
    name, value = knob.name, checked.values[knob.name]
    if knob.required == "multi-node" or (knob.optional and value == ""):
        return
    if knob.type == "choice" and value not in knob.choices:
        why = f"{knob.choices_why}; " if knob.choices_why else ""
        raise refusal(name, value, f"{why}accepted: " + " | ".join(knob.choices))
    if knob.type == "flag" and value not in ("0", "1"):
        raise refusal(name, value, "accepted: 0 | 1")
    if knob.type == "int":
        _int_check(knob, value)
    if knob.type in ("text", "path") and knob.pattern and value and not re.fullmatch(
            knob.pattern, value):
        raise refusal(name, value, f"accepted: {knob.accepted}")
    if knob.type == "path":
        root = checked.root if knob.relative_to == "repository" else None
        expanded = expand_path(value, home, root)
        if knob.mount and not _mountable(expanded):
            raise refusal(name, value, PATH_ACCEPTED)
        checked.values[name] = expanded
    if knob.type == "words":
        checked.words[name] = shell_words.split(name, value)


def _mountable(path: str) -> bool:
    """An absolute path that can go into `docker run --mount` (which splits on commas)."""
    return path.startswith("/") and "," not in path and not _CONTROL.search(path)


def _bounds(checked: Checked, knob: Knob) -> None:
    """A value past the knob's safe bound is refused unless its FORCE_ knob is 1."""
    value = checked.values[knob.name]
    if not knob.force or checked.values[knob.force] == "1" or value == "":
        return
    context = {"safe_max": knob.safe_max, "value": value, **checked.recipe.knobs}
    why = knob.unsafe_why_by.get(value, knob.unsafe_why).format(**context)
    if knob.safe_max is not None and int(value) > knob.safe_max:
        raise refusal(knob.name, value, f"{why}; accepted: {knob.min}..{knob.safe_max}, or set "
                      f"{knob.force}=1")
    if knob.safe and value not in knob.safe:
        raise refusal(knob.name, value, f"{why}; accepted: {' | '.join(knob.safe)}, or set "
                      f"{knob.force}=1")


def _required(checked: Checked, knob: Knob) -> None:
    """A knob needed with two or more nodes: set, and of its pattern."""
    if knob.required != "multi-node" or not checked.multi_node:
        return
    value = checked.values[knob.name]
    if not value:
        raise unset_refusal(knob.name, knob.unset_why)
    if knob.pattern and not re.fullmatch(knob.pattern, value):
        raise refusal(knob.name, value, f"accepted: {knob.accepted}")


# ----------------------------------------------------------------------------- rules


def _drafter(checked: Checked, knob: Knob) -> None:
    checked.drafter = describe(checked["DRAFTER"], checked["DRAFTER_WINDOW"])


def _above_zero(checked: Checked, knob: Knob) -> None:
    if re.fullmatch(r"0\.0*", checked[knob.name]):
        raise refusal(knob.name, checked[knob.name], f"accepted: {knob.accepted}")


def _generation_config(checked: Checked, knob: Knob) -> None:
    checked.generation_json = merged_json(checked["MAX_NEW_TOKENS"], checked["GENERATION_CONFIG"])


def _serving_image(checked: Checked, knob: Knob) -> None:
    image = checked["IMAGE"]
    if _STOCK_IMAGE.match(image) and checked["FORCE_STOCK_IMAGE"] != "1":
        chain = profile_default(checked.recipe, checked.values, "IMAGE")
        raise refusal("IMAGE", image, "stock vllm/vllm-openai images lack the v9-v11 layers "
                      "(DFlash2 backport, Glm5Next tap capture, draft KV group); accepted: "
                      f"{chain} (scripts/build.sh), or set FORCE_STOCK_IMAGE=1")
    layer = chain_layer_number(checked.recipe, image)
    if layer is not None and chain_layers() and layer not in chain_layers():
        tags = " | ".join(f"{checked.recipe.chain_prefix}v{number}" for number in chain_layers())
        raise refusal("IMAGE", image, f"the image chain has no v{layer} (docker/ has no "
                      f"{dockerfile_of(f'v{layer}').name}); accepted: {tags}, or an image named "
                      "otherwise")
    asked = levers_asked(checked)
    if layer is not None and layer < LEVERS_LAYER and asked:
        raise refusal("IMAGE", image, f"image v{layer} predates layer v{LEVERS_LAYER}, which "
                      f"reads {' '.join(asked)}: it would serve without them; accepted: "
                      f"{checked.recipe.chain_prefix}v{LEVERS_LAYER}, or turn them off (README's "
                      "rollback line)")


# The layer whose switches and weight groups the GLM53_* variables drive (recipekit/layers/v13.py).
LEVERS_LAYER = 13


def chain_layers() -> list[int]:
    """N of every layer vN the chain builds: those with a Dockerfile (scripts/build.sh's)."""
    return [number for number in range(1, 100) if dockerfile_of(f"v{number}").is_file()]


def chain_layer_number(recipe: Recipe, image: str) -> int | None:
    """N of a chain tag <prefix>vN (after any registry path or test prefix); None otherwise."""
    found = re.search(re.escape(recipe.chain_prefix) + r"v([0-9]+)(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$",
                      image)
    return int(found.group(1)) if found else None


def image_switches(recipe: Recipe) -> list[Knob]:
    """The flag knobs that set an image layer's GLM53_* variable (image v13's switches)."""
    return [knob for knob in recipe.knobs.values()
            if knob.type == "flag" and any(name.startswith("GLM53_") for name in knob.env)]


def levers_asked(checked: Checked) -> list[str]:
    """NAME=value of each setting only layer v13 carries out: its switches at 1 (not a FORCE_
    knob, which asks nothing by itself), target weight groups, an NVFP4 DFlash2 drafter."""
    forces = {knob.force for knob in checked.recipe.knobs.values()}
    asked = [f"{knob.name}=1" for knob in image_switches(checked.recipe)
             if knob.name not in forces and checked[knob.name] == "1"]
    if checked["TARGET_WEIGHT_GROUPS_INT8"]:
        asked.append(f"TARGET_WEIGHT_GROUPS_INT8={checked['TARGET_WEIGHT_GROUPS_INT8']}")
    if checked["DRAFT_WEIGHTS"] == "nvfp4" and checked["SPEC"] == "dflash2":
        asked.append("DRAFT_WEIGHTS=nvfp4")
    return asked


# GLM-5.3-Flash's indexer pools 4 tokens (index_kpool); image v13 sizes the tail ring from it.
_KPOOL = 4


def kpool_ring(k: int) -> int:
    """Tail-ring slots image v13 uses with k drafts: max(kpool, next power of two >= k + kpool - 1)."""
    return max(_KPOOL, 1 << (k + _KPOOL - 2).bit_length())


def _kpool_ring(checked: Checked, knob: Knob) -> None:
    if checked["KPOOL_TAIL_FIX"] != "1" or checked["SPEC"] == "off" or not checked["BLOCK_SIZE"]:
        return  # no drafts, or vLLM picks the block size: the engine checks the ring at start
    k_knob = "NUM_SPECULATIVE_TOKENS" if checked["SPEC"] == "dflash2" else "MTP_NUM_SPECULATIVE_TOKENS"
    ring = kpool_ring(int(checked[k_knob]))
    if int(checked["BLOCK_SIZE"]) % ring:
        raise refusal("BLOCK_SIZE", checked["BLOCK_SIZE"],
                      f"KPOOL_TAIL_FIX=1 needs the tail ring ({ring} slots at {k_knob}="
                      f"{checked[k_knob]}) to divide the block size; accepted: a multiple of "
                      f"{ring}, or set KPOOL_TAIL_FIX=0")


def _adaptive_verify(checked: Checked, knob: Knob) -> None:
    if checked["ADAPTIVE_VERIFY"] == "":  # on wherever the drafter reports a confidence and
        layer = chain_layer_number(checked.recipe, checked["IMAGE"])  # the image carries it
        carried = layer is None or layer >= LEVERS_LAYER
        checked.values["ADAPTIVE_VERIFY"] = "1" if checked["SPEC"] == "dflash2" and carried else "0"
    if checked["ADAPTIVE_VERIFY"] == "1" and checked["SPEC"] != "dflash2":
        raise refusal("ADAPTIVE_VERIFY", "1", f"adaptive verify needs a drafter that reports "
                      f"confidence (DFlash2's selector); SPEC={checked['SPEC']} has none: set "
                      "ADAPTIVE_VERIFY=0")


def _skip_mtp_weights(checked: Checked, knob: Knob) -> None:
    if checked["SKIP_MTP_WEIGHTS"] == "1" and checked["SPEC"] == "mtp":
        raise refusal("SKIP_MTP_WEIGHTS", "1", "SPEC=mtp drafts with the MTP layer whose weights "
                      "this skips; set SKIP_MTP_WEIGHTS=0")


def _adaptive_verify_max(checked: Checked, knob: Knob) -> None:
    most = checked["ADAPTIVE_VERIFY_MAX"]
    if most and checked["ADAPTIVE_VERIFY"] == "1" and int(most) > int(checked["NUM_SPECULATIVE_TOKENS"]):
        raise refusal("ADAPTIVE_VERIFY_MAX", most, "a step cannot verify more drafts than it "
                      f"drafts; accepted: 0 to NUM_SPECULATIVE_TOKENS ({checked['NUM_SPECULATIVE_TOKENS']}), "
                      "or empty for all")


def _model(checked: Checked, knob: Knob) -> None:
    model = checked["MODEL"]
    if model.startswith("/"):
        if not _mountable(model):
            raise refusal("MODEL", model, PATH_ACCEPTED)
    elif not _REPO_ID.fullmatch(model):
        raise refusal("MODEL", model, "accepted: a Hugging Face repo id (org/name) or an "
                      "absolute directory")
    known = checked.recipe.checkpoints.get(model)
    spec = checked["SPEC"]
    if known and spec in known.spec_refused:
        others = [choice for choice in checked.recipe.knobs["SPEC"].choices
                  if choice not in known.spec_refused]
        raise refusal("SPEC", spec, f"{model}: {known.spec_refused[spec]}; accepted: "
                      f"{' | '.join(others)}, or another MODEL")


def _model_revision(checked: Checked, knob: Knob) -> None:
    revision = checked["MODEL_REVISION"]
    if checked["MODEL"].startswith("/"):
        if revision:
            raise refusal("MODEL_REVISION", revision, "a local MODEL directory has no revision; "
                          "accepted: empty")
    elif revision and not _HEX40.fullmatch(revision):
        raise refusal("MODEL_REVISION", revision, "accepted: a 40-hex commit hash, or empty to "
                      "resolve once and pin")


def _nodes(checked: Checked, knob: Knob) -> None:
    text = checked["NODES"]
    nodes = [node for node in re.split(r"[ \t\n,]+", text) if node]
    if not nodes:
        raise unset_refusal("NODES", knob.unset_why)
    if len(nodes) > _MAX_NODES:
        raise refusal("NODES", text, f"accepted: 1 to {_MAX_NODES} addresses")
    for at, node in enumerate(nodes):
        if not _HOST.fullmatch(node):
            raise refusal("NODES", text, f"'{node}' is not a host name or address; accepted: "
                          "addresses separated by spaces or commas, head first")
        if node in nodes[:at]:
            raise refusal("NODES", text, f"'{node}' is listed twice; accepted: distinct addresses")
        if len(nodes) > 1 and not (_IPV4.fullmatch(node) or _IPV6.fullmatch(node)):
            raise refusal("NODES", text, f"'{node}' is a name; with two or more nodes each entry "
                          "is that node's address on the link (it becomes VLLM_HOST_IP and "
                          "--master-addr); accepted: IPv4 or IPv6 addresses")
    checked.nodes = nodes


def _tensor_parallel(checked: Checked, knob: Knob) -> None:
    count, tp = len(checked.nodes), checked["TP"]
    if not tp:
        checked.values["TP"] = str(count)
    elif not _TP.fullmatch(tp) or int(tp) % count:
        raise refusal("TP", tp, f"accepted: a multiple of the node count {count} (each node "
                      "runs TP / nodes ranks), or empty for the node count")


def _master_port(checked: Checked, knob: Knob) -> None:
    if checked["PORT"] == checked["MASTER_PORT"]:
        raise refusal("MASTER_PORT", checked["MASTER_PORT"], "equals PORT; accepted: a different "
                      "port")


def _remote_exec(checked: Checked, knob: Knob) -> None:
    if not checked.words["SSH"] or not checked.words["SSH"][0]:
        raise refusal("SSH", checked["SSH"], "accepted: a remote-exec command such as ssh -o "
                      "BatchMode=yes")


def owner_phrase(owners: str) -> str:
    """The end of a refusal naming what sets a flag or variable."""
    return FIXED_PHRASE if not owners else f"set from {owners}; set that instead"


def secret_flag(word: str) -> str | None:
    """The SECRET_FLAGS flag WORD names, whole or by an argparse prefix (`--api-k`), or None."""
    flag = word.split("=", 1)[0]
    if not flag.startswith("--") or len(flag) < 3:
        return None
    return next((secret for secret in SECRET_FLAGS if secret.startswith(flag)), None)


def hidden_secrets(words: list[str]) -> str:
    """WORDS as one line with every secret flag's value replaced by HIDDEN."""
    shown, hide_next = [], False
    for word in words:
        if hide_next:
            shown.append(HIDDEN)
            hide_next = False
        elif secret_flag(word) and "=" in word:
            shown.append(word.split("=", 1)[0] + "=" + HIDDEN)
        else:
            shown.append(word)
            hide_next = secret_flag(word) is not None
    return shell_words.quote(shown)


def _extra_args(checked: Checked, knob: Knob) -> None:
    """No flag that carries a credential (it would be on every rank's command line), and no
    flag the launcher sets, not even by an argparse prefix (the seed's --kv-cache-memory was
    one) or a --no- negation."""
    for word in checked.words["EXTRA_ARGS"]:
        if secret := secret_flag(word):
            flag = word.split("=", 1)[0]
            read_as = "" if flag == secret else f" (vLLM reads it as {secret})"
            setting, what = SECRET_FLAGS[secret]
            raise refusal("EXTRA_ARGS", hidden_secrets(checked.words["EXTRA_ARGS"]),
                          f"{flag}{read_as} would put a credential on every rank's command line "
                          f"(ps, docker inspect) and in DRY_RUN's output; accepted: {what} in "
                          f"{setting}, which the launcher hands over without a command line")
    owners = checked.recipe.flag_owners()
    for word in checked.words["EXTRA_ARGS"]:
        if not word.startswith("--") or len(word) < 3:
            continue
        flag = word.split("=", 1)[0]
        if flag.startswith("--no-") and len(flag) > 5:
            flag = "--" + flag[5:]
        for managed, owner in owners.items():
            if managed.startswith(flag):
                raise refusal("EXTRA_ARGS", checked["EXTRA_ARGS"],
                              f"{word.split('=', 1)[0]} would override {managed}, which the "
                              f"launcher sets: {owner_phrase(owner)}")


def _extra_env(checked: Checked, knob: Knob) -> None:
    """NAME=VALUE words for the rank containers, engine variables only; a refusal shows the
    offending word alone (a secret-looking one without its value)."""
    owners = checked.recipe.env_owners()
    for word in checked.words["EXTRA_ENV"]:
        name = word.split("=", 1)[0]
        if "=" not in word or not _ENV_NAME.fullmatch(name):
            raise refusal("EXTRA_ENV", word, "not NAME=VALUE with an environment variable name; "
                          "accepted: NAME=VALUE words, NAME in capitals")
        if _SECRET_NAME.search(name):
            raise refusal("EXTRA_ENV", f"{name}={HIDDEN}", f"{name} looks like a credential (holds "
                          "TOKEN, KEY, SECRET or PASSWORD) and would show in docker inspect; "
                          "accepted: engine settings only (the API key goes in API_KEY_FILE, "
                          "the Hub token in HF_TOKEN_FILE)")
        if name in owners:
            raise refusal("EXTRA_ENV", word, f"the launcher sets {name}: "
                          f"{owner_phrase(owners[name])}")
        if not name.startswith(knob.prefixes):
            raise refusal("EXTRA_ENV", word, f"{name} is not an engine variable; accepted: names "
                          f"starting with {' '.join(knob.prefixes)}")


def _docker_env_names(words: list[str]) -> list[str]:
    """The NAMEs DOCKER_ARGS sets with -e/--env NAME=VALUE (or --env=..., -eNAME=...)."""
    names, take_next = [], False
    for word in words:
        setting = None
        if take_next:
            setting, take_next = word, False
        elif word in ("-e", "--env"):
            take_next = True
        elif word.startswith("--env="):
            setting = word.removeprefix("--env=")
        elif word.startswith("-e") and not word.startswith("--"):
            setting = word[2:]
        if setting is not None and "=" in setting:
            names.append(setting.split("=", 1)[0])
    return names


def _docker_args(checked: Checked, knob: Knob) -> None:
    """No credential as a `docker run --env NAME=VALUE`: it would be on the command line."""
    for name in _docker_env_names(checked.words["DOCKER_ARGS"]):
        if _SECRET_NAME.search(name):
            raise refusal("DOCKER_ARGS", f"--env {name}={HIDDEN}", f"{name} looks like a "
                          "credential (holds TOKEN, KEY, SECRET or PASSWORD) and would show on "
                          "the docker command line and in docker inspect; accepted: the API key "
                          "in API_KEY_FILE, the Hub token in HF_TOKEN_FILE")


def _draft_tp(checked: Checked, knob: Knob) -> None:
    if checked["DRAFT_TP"] == "1":
        raise refusal("DRAFT_TP", "1", "vLLM's DFlash and DFlash2 loader (v1/worker/gpu/"
                      "spec_decode/dflash/utils.py, load_dflash_model, in 0.30.0, 0.33.0, 0.34.0 "
                      "and the vendor fork) builds the drafter with the target's parallel config "
                      "and never reads draft_tensor_parallel_size, so the drafter would still be "
                      "split across the nodes; accepted: target")


def _gpu_clock(checked: Checked, knob: Knob) -> None:
    value = checked["GPU_CLOCK_MHZ"]
    low, _, high = value.partition(",")
    if high and int(low) > int(high):
        raise refusal("GPU_CLOCK_MHZ", value, f"the lowest clock {low} MHz is above the highest "
                      f"{high}; accepted: N, or MIN,MAX with MIN at most MAX")


RULES: dict[str, Callable[[Checked, Knob], None]] = {
    "drafter": _drafter, "above_zero": _above_zero, "generation_config": _generation_config,
    "serving_image": _serving_image, "model": _model, "model_revision": _model_revision,
    "nodes": _nodes, "tensor_parallel": _tensor_parallel, "master_port": _master_port,
    "remote_exec": _remote_exec, "extra_args": _extra_args, "extra_env": _extra_env,
    "docker_args": _docker_args,
    "kpool_ring": _kpool_ring, "adaptive_verify": _adaptive_verify,
    "adaptive_verify_max": _adaptive_verify_max, "skip_mtp_weights": _skip_mtp_weights,
    "gpu_clock": _gpu_clock, "draft_tp": _draft_tp,
}


def check(recipe: Recipe, values: dict[str, str], root: Path, home: str,
          only: tuple[str, ...] | None = None) -> Checked:
    """VALUES checked in the recipe's order (ONLY: just these knobs, as stop.sh needs)."""
    checked = Checked(recipe, root, dict(values))
    knobs = [knob for knob in recipe.knobs.values() if only is None or knob.name in only]
    for knob in knobs:
        if knob.none and checked.values[knob.name] == "none":
            checked.values[knob.name] = ""
    for knob in knobs:
        _own_value(checked, knob, home)
    for knob in knobs:
        _bounds(checked, knob)
        _required(checked, knob)
        if knob.rule:
            RULES[knob.rule](checked, knob)
    return checked
