builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 3072 : i64} {
  %n0, %n0t = turnip.input at <0, 0, 1024> {task = "x"} : tensor<16x16xf32>
  %n1, %n1t = turnip.relu %n0 at <0, 1024, 1024> {task = "a"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n2, %n2t = turnip.exp %n1 at <0, 2048, 1024> {task = "b"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n3, %n3t = turnip.offload %n1 on 0 to <0, 1024> after[%n2t] {task = "a"} : tensor<16x16xf32>
  %n4, %n4t = turnip.scale %n0 at <0, 1024, 1024> after[%n3t] {task = "c", factor = 2.000000e+00 : f64} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %n2, %n3, %n4 : tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>
}

