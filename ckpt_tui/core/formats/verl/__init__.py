"""verl FSDP checkpoints: per-rank ``model/optim/extra_state_world_size_N_rank_R.pt`` files (``format``) and their
export sources (``source``)."""
