# SyncBatchNorm and convert_sync_batchnorm (src/parallel/sync_batch_norm.cpp): ranks are threads
# of the test process, each with its own ProcessGroupGloo on loopback over a shared HashStore.
dtrain_test(sync_batch_norm_test LABELS unit SOURCES unit/sync_batch_norm_test.cpp TORCH)
