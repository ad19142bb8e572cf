"""Other codebases' weights as energyzoo models: the Hyper-SET authors' checkpoints as Hub-ready folders
(`hyperset`, `energyzoo convert hyperset-original`) and the public FEM reference layer's as an `FEMAttention` that
computes its function (`fem_reference`)."""
