// einsum subscripts must match the operand's rank.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a = turnip.input on 0 : tensor<4x4xf32>
  %c = turnip.einsum %a on 0 {equation = "ijk->k"} : (tensor<4x4xf32>) -> tensor<4xf32>
}
