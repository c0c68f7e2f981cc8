// add of f32 and f16 operands.
builtin.module attributes {turnip.devices = 2 : i64} {
  %a = turnip.input on 0 : tensor<4x4xf32>
  %b = turnip.input on 0 : tensor<4x4xf16>
  %c = turnip.add %a, %b on 0 : (tensor<4x4xf32>, tensor<4x4xf16>) -> tensor<4x4xf32>
}
