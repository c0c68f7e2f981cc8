// An rmsnorm weight must match the last axis.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a, %at = turnip.input on 0 : tensor<4x8xf32>
  %w, %wt = turnip.input on 0 : tensor<4xf32>
  %c, %ct = turnip.rmsnorm %a, %w on 0 : (tensor<4x8xf32>, tensor<4xf32>) -> tensor<4x8xf32>
}
