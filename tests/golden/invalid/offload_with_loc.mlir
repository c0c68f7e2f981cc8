// An offload writes CPU storage, never a GPU location.
builtin.module attributes {turnip.devices = 2 : i64, turnip.budget = 4096 : i64} {
  %a, %at = turnip.input at <0, 0, 64> : tensor<4x4xf32>
  %a.offload1, %a.offload1t = "turnip.offload"(%a) <{device = 0 : i64, storage = #turnip.storage<0, 64>, loc = #turnip.loc<0, 64, 64>, operandSegmentSizes = array<i32: 1, 0, 0>}> : (tensor<4x4xf32>) -> (tensor<4x4xf32>, !turnip.token)
}
