"""README's launcher defaults table says exactly what launcher/defaults.env holds."""

import re

from tests.unit.test_launcher_support import REPO

_ROW = re.compile(r"^\| `([A-Z_][A-Z0-9_]*)` \| (`[^`]*`|—) \|")
_EMPTY = "—"


def default_settings():
    """NAME -> default from launcher/defaults.env, read as run.sh reads it (literally)."""
    settings = {}
    for line in (REPO / "launcher" / "defaults.env").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, value = line.partition("=")
        assert name not in settings, f"{name} is defined twice"
        settings[name] = value
    return settings


def readme_defaults():
    text = (REPO / "README.md").read_text()
    section = text.split("<!-- section:launcher:start -->", 1)[1]
    section = section.split("<!-- section:launcher:end -->", 1)[0]
    table = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match:
            name, cell = match.groups()
            assert name not in table, f"README lists {name} twice"
            table[name] = "" if cell == _EMPTY else cell.strip("`")
    return table


def test_readme_table_lists_every_default_with_its_value():
    assert readme_defaults() == default_settings()


def test_defaults_are_the_seed_verified_run():
    """REFERENCE.md, "The seed's deployment": the PR-era run and the later lessons."""
    settings = default_settings()
    seed = {
        "SPEC": "dflash2", "DRAFTER": "incoai", "NUM_SPECULATIVE_TOKENS": "5",
        "MAX_NUM_SEQS": "4", "MAX_MODEL_LEN": "327680", "ENFORCE_EAGER": "0",
        "KV_CACHE_MEMORY_BYTES": "4445787956", "KV_CACHE_DTYPE": "fp8_e4m3",
        "IMAGE": "glm53-sm121-v11", "MODEL": "LibertAIDAI/GLM-5.3-Flash-NVFP4",
        "BLOCK_SIZE": "2304", "GPU_MEMORY_UTILIZATION": "0.85", "MOE_BACKEND": "marlin",
        "TOOL_CALL_PARSER": "glm47", "REASONING_PARSER": "glm45", "THINKING": "0",
        "PORT": "8000", "CUDA_ARCH_LIST": "12.1a", "ENGINE_READY_TIMEOUT": "3600",
        "NCCL_DEBUG_LEVEL": "WARN",
        "DOCKER_ARGS": "--gpus all --device /dev/infiniband --ulimit memlock=-1:-1",
        # later lessons
        "LINEAR_BACKEND": "marlin", "MM_PROCESSOR_CACHE_GB": "1", "MAX_NEW_TOKENS": "65536",
        "JIT_CACHE": "~/.cache/glm53-jit",
        # the memory guard the seed grew
        "MEM_GUARD": "1", "MEM_SAMPLES_PER_SECOND": "4", "MEM_FLOOR_LOAD_GIB": "10",
        "MEM_FLOOR_PROFILE_GIB": "8", "MEM_FLOOR_KV_READY_GIB": "3", "MEM_FLOOR_SERVING_GIB": "2",
    }
    assert {name: settings[name] for name in seed} == seed


def test_the_seeds_commits_are_pinned_where_the_launcher_reads_them():
    from recipekit.drafters import catalog

    assert catalog.DRAFTERS["incoai"].revision == "7d74cdd881ed7e32c31175984a67823127b66cfe"
    settings_sh = (REPO / "launcher" / "lib" / "settings.sh").read_text()
    assert '["LibertAIDAI/GLM-5.3-Flash-NVFP4"]=aa28e1f54130286c95fee10d0705c74ce8743734' in settings_sh


def test_no_site_values_are_baked_in():
    settings = default_settings()
    assert settings["NODES"] == settings["IFACE"] == settings["HCA"] == ""
    assert settings["MODEL_REVISION"] == settings["DRAFTER_REVISION"] == ""
