// The generic form parses too, and prints back in the custom form.
"builtin.module"() ({
  %x = "turnip.input"() <{device = 0 : i64}> : () -> tensor<2x2xf32>
  %y = "turnip.scale"(%x) <{device = 0 : i64, factor = 2.000000e+00 : f64, operandSegmentSizes = array<i32: 1, 0, 0>}> : (tensor<2x2xf32>) -> tensor<2x2xf32>
  "turnip.output"(%y) : (tensor<2x2xf32>) -> ()
}) {turnip.devices = 1 : i64} : () -> ()
