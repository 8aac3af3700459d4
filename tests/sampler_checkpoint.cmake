# DistributedSampler (src/parallel/sampler.cpp): hand-computed cases and an exact comparison
# with python3-torch's torch.utils.data.DistributedSampler (required: the test fails without it).
dtrain_test(sampler_test LABELS unit SOURCES unit/sampler_test.cpp launcher/subprocess.cpp TORCH)
# Checkpoints (src/parallel/checkpoint.cpp): round trip, mismatch errors, atomic writes under a
# failing and a crashing save, and bitwise-exact resume of an Adam + dropout run.
dtrain_test(checkpoint_test LABELS unit SOURCES unit/checkpoint_test.cpp TORCH)
# FusedAdam (src/optim/fused_adam.cpp) step for step against torch::optim::Adam, and its state.
dtrain_test(fused_adam_test LABELS unit SOURCES unit/fused_adam_test.cpp TORCH)
