"""What v10 and v11 share: they patch Glm5Next, so a base without it is refused the same way."""

from __future__ import annotations

from recipekit.codepatch import CodePatchLayer
from recipekit.tree import TreeView

PACKAGE = "vllm/models/glm5next"
NO_GLM5NEXT = (
    "the base has no Glm5Next (vllm/models/glm5next/ is absent); v10 and v11 need a "
    "Glm5Next base such as vLLM 0.30.0 or the fork image"
)


class Glm5NextPatchLayer(CodePatchLayer):
    """A code-patch layer that only a base with Glm5Next can take."""

    def base_problem(self, view: TreeView) -> str | None:
        return None if view.exists(f"{PACKAGE}/__init__.py") else NO_GLM5NEXT
