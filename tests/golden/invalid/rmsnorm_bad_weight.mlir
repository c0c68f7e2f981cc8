// An rmsnorm weight must match the last axis.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a = turnip.input on 0 : tensor<4x8xf32>
  %w = turnip.input on 0 : tensor<4xf32>
  %c = turnip.rmsnorm %a, %w on 0 : (tensor<4x8xf32>, tensor<4xf32>) -> tensor<4x8xf32>
}
