// dtrain: distributed training for the libtorch C++ frontend. The umbrella header.
#pragma once

#include "dtrain/checkpoint.h"
#include "dtrain/collectives.h"
#include "dtrain/codec.h"
#include "dtrain/deepspeed_distributor.h"
#include "dtrain/ddp.h"
#include "dtrain/distributor.h"
#include "dtrain/env.h"
#include "dtrain/error.h"
#include "dtrain/mlflow.h"
#include "dtrain/process_group.h"
#include "dtrain/progress.h"
#include "dtrain/sampler.h"
#include "dtrain/sync_batch_norm.h"
#include "dtrain/zero.h"
#include "dtrain/timeline.h"
