# The fuzz targets: tests/fuzz/NAME_fuzz.cpp, seeds in tests/fuzz/corpus/NAME, inputs that
# once found a bug in tests/fuzz/regressions/NAME. Included twice, with dtrain_fuzz defined
# differently: by tests/fuzz.cmake (the normal suite replays each target over its inputs) and
# by tests/fuzz/libfuzzer.cmake (DTRAIN_FUZZ=ON, clang: libFuzzer binaries, scripts/fuzz.sh).
#   dtrain_fuzz(NAME [TORCH] [DATA] [LIBS lib...] [SOURCES src...])
# LIBS: what the harness links in both builds (dtrain::core pieces); TORCH: it needs
# libtorch (the normal suite links libdtrain; the fuzz build links libtorch and compiles
# SOURCES, the few dtrain sources the harness needs, with the sanitizers). DATA: it tests
# dtrain::data (the normal suite links dtrain_data; the fuzz build compiles SOURCES); left out
# of a build without dtrain::data (DTRAIN_HAVE_DATA off).

# The job's store: both TCPStore protocols and the token, server side and client side.
dtrain_fuzz(store_server LIBS dtrain_core)
dtrain_fuzz(store_client LIBS dtrain_core)
# DeepSpeed JSON through its public entry point.
dtrain_fuzz(deepspeed_config LIBS dtrain_core)
# Slurm / Open MPI / MPICH environment parsing.
dtrain_fuzz(engine_env LIBS dtrain_core)
# Host files and -H lists.
dtrain_fuzz(hostfile LIBS dtrain_core)
# The fork server's spec (libc only).
dtrain_fuzz(forkserver_spec)
# What an MLflow server answers.
dtrain_fuzz(mlflow_response LIBS dtrain_tracking)
# The Distributor's codec.
dtrain_fuzz(codec TORCH SOURCES src/distributor/codec.cpp src/core/memory.cpp src/core/error.cpp)
# ElasticState's commit reader.
dtrain_fuzz(elastic_commit TORCH SOURCES src/elastic/commit_reader.cpp src/core/error.cpp)
# Delta deletion vectors: a DV file's framing, the serialized roaring bitmap array, inline Z85.
dtrain_fuzz(deletion_vector DATA LIBS roaring::roaring ZLIB::ZLIB
            SOURCES src/data/deletion_vector.cpp src/data/delta_replay.cpp src/core/error.cpp)
# Delta log replay: commits' JSON actions to a snapshot (and the inline vectors it names).
dtrain_fuzz(delta_log DATA LIBS roaring::roaring ZLIB::ZLIB
            SOURCES src/data/deletion_vector.cpp src/data/delta_replay.cpp src/core/error.cpp)
