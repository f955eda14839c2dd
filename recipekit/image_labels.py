"""The labels the image chain writes on every layer image that the launcher reads back."""

BASE_VLLM = "glm53.base.vllm"  # the base's vLLM release, as its vllm/_version.py states it; "-"
PROVIDED = "glm53.provided"  # the chain's layers whose work the base already does, space-separated
PACKAGES = "glm53.packages"  # what layer v8 installed and checked: NAME==VERSION, comma-separated
