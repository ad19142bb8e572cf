"""All model code of energyzoo, in one flat folder so that exported checkpoints carry it as remote code:
`save_pretrained` of a class registered for an Auto class copies its file and every file it imports as
``from .module import Name``, transitively, and only so. Files here import siblings only that way (no ``..``, no
sub-packages, no absolute ``energyzoo.`` imports); optional kernels are imported behind availability checks."""
