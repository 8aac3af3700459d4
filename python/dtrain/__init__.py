"""dtrain's Python side: dtrain.spark runs dtrain programs on a Spark cluster."""
