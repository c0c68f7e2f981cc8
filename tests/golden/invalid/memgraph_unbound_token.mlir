// An op at a location (a memgraph op) yields its tensor and a token; binding the tensor alone is an error.
builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 1024 : i64} {
  %x, %xt = turnip.input at <0, 0, 64> : tensor<4x4xf32>
  %y = turnip.relu %x at <0, 64, 64> : (tensor<4x4xf32>) -> tensor<4x4xf32>
}
