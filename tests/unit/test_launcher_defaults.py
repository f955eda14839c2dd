"""The knob defaults are the seed's verified run, and its commits are pinned where the
launcher reads them (recipe.toml and the drafter catalog)."""

from recipekit import recipe


def default_settings(profile="default"):
    """NAME -> value under PROFILE when nothing else sets it, from recipe.toml."""
    the_recipe = recipe.load()
    overlay = the_recipe.profiles[profile].values
    return {name: overlay.get(name, knob.default) for name, knob in the_recipe.knobs.items()}


def test_the_seed_pr_profile_is_the_seed_verified_run():
    """The seed's PR #1 era run and the lessons it learned later (its repository)."""
    settings = default_settings("seed-pr")
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
        # image v11 has no v13 levers: none set
        "KPOOL_TAIL_FIX": "0", "TARGET_WEIGHT_GROUPS_INT8": "none", "DRAFT_WEIGHTS": "",
    }
    assert {name: settings[name] for name in seed} == seed


def test_the_defaults_are_the_seeds_measured_v13_setting():
    """The seed's v13 repository: image v13, DFlash2 k=7 at 2 seqs, the kpool tail fix, INT8
    weight-only on five target groups at group 128 (empty: the runtime's 128), NVFP4 drafter."""
    settings = default_settings()
    v13 = {"IMAGE": "glm53-sm121-v13", "SPEC": "dflash2", "NUM_SPECULATIVE_TOKENS": "7",
           "MAX_NUM_SEQS": "2", "KPOOL_TAIL_FIX": "1",
           "TARGET_WEIGHT_GROUPS_INT8": "shared,mla,kda_o,kda_in,lm_head", "INT_GROUP_SIZE": "",
           "TARGET_WEIGHT_FORMAT": "", "DRAFT_WEIGHTS": "nvfp4"}
    assert {name: settings[name] for name in v13} == v13
    changed = {name for name in v13 if settings[name] != default_settings("seed-pr")[name]}
    assert changed == {"IMAGE", "NUM_SPECULATIVE_TOKENS", "MAX_NUM_SEQS", "KPOOL_TAIL_FIX",
                       "TARGET_WEIGHT_GROUPS_INT8", "DRAFT_WEIGHTS"}
    sources = {name: recipe.load().knobs[name].source for name in changed}
    assert set(sources.values()) == {"seed-v13"}, sources


def test_the_seeds_commits_are_pinned_where_the_launcher_reads_them():
    from recipekit.drafters import catalog

    assert catalog.DRAFTERS["incoai"].revision == "7d74cdd881ed7e32c31175984a67823127b66cfe"
    assert recipe.load().pins["LibertAIDAI/GLM-5.3-Flash-NVFP4"][0] == (
        "aa28e1f54130286c95fee10d0705c74ce8743734")


def test_no_site_values_are_baked_in():
    for profile in recipe.load().profiles:
        settings = default_settings(profile)
        assert settings["NODES"] == settings["IFACE"] == settings["HCA"] == ""
        assert settings["MODEL_REVISION"] == settings["DRAFTER_REVISION"] == ""
