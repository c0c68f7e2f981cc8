// An einsum equation without an explicit output.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a = turnip.input on 0 : tensor<4x4xf32>
  %c = turnip.einsum %a on 0 {equation = "ij"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
}
