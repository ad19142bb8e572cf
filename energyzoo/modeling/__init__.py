"""All model code of energyzoo, in one flat folder so that exported checkpoints carry it as remote code
(see DESIGN.md, "Remote code"). Files here import siblings only as ``from .module import Name``."""
