# Model parallelism (#16): new_group and DeviceMesh, tensor-parallel layers, pipeline
# schedules. Ranks are threads of one process, each with its own Gloo groups over one
# in-memory store (tests/support/thread_group.h), so a test loads libtorch once.
dtrain_test(model_parallel_test LABELS model_parallel TORCH
  SOURCES model_parallel/mesh_test.cpp model_parallel/tensor_parallel_test.cpp model_parallel/pipeline_test.cpp)
# The example's transformer LM in 3D (dp x pp x tp = 2 x 2 x 2) against one rank.
if(TARGET gpt_model)
  dtrain_test(model_parallel_gpt_test LABELS model_parallel TORCH SOURCES model_parallel/gpt_3d_test.cpp LIBS gpt_model)
  target_compile_definitions(model_parallel_gpt_test PRIVATE DTRAIN_GPT_CORPUS="/usr/share/common-licenses/GPL-3")
endif()
# The example through `dtrain run` (real processes).
if(TARGET gpt)
  dtrain_test(model_parallel_example_test LABELS model_parallel SOURCES model_parallel/gpt_example_test.cpp launcher/subprocess.cpp)
  dtrain_test_programs(model_parallel_example_test GPT_BIN gpt)
  add_dependencies(model_parallel_example_test gpt dtrain_cli)
endif()
