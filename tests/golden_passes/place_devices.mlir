// PIPELINE: turnip-place-devices{devices=2}
// Unplaced kernels (no "on") get a GPU; an operand on another GPU is moved there once.
builtin.module attributes {turnip.devices = 2 : i64} {
  %x = turnip.input on 0 : tensor<16x16xf32>
  %y = turnip.input on 1 : tensor<16x16xf32>
  %a = turnip.relu %x : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %b = turnip.relu %y : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %c = turnip.add %a, %b : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %c : tensor<16x16xf32>
}
