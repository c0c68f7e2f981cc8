builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 4096 : i64} {
  %n0, %n0t = turnip.input at <0, 0, 1024> {task = "x"} : tensor<16x16xf32>
  %n1, %n1t = turnip.relu %n0 at <0, 1024, 1024> {task = "a"} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n2, %n2t = turnip.scale %n0 at <0, 2048, 1024> {task = "b", factor = 5.000000e-01 : f64} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n3, %n3t = turnip.add %n1, %n2 at <0, 3072, 1024> {task = "c"} : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %n4, %n4t = turnip.offload %n2 on 0 to <0, 1024> {task = "b"} : tensor<16x16xf32>
  %n5, %n5t = turnip.mul %n3, %n0 at <0, 2048, 1024> after[%n4t] redundant[%n2t, %n3t] {task = "d"} : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %n6, %n6t = turnip.add %n5, %n1 at <0, 0, 1024> redundant[%n0t, %n1t, %n2t, %n5t] {task = "e"} : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %n7, %n7t = turnip.reload %n4 at <0, 3072, 1024> after[%n5t] {task = "b"} : tensor<16x16xf32>
  %n8, %n8t = turnip.add %n6, %n7 at <0, 1024, 1024> redundant[%n1t, %n3t, %n6t] {task = "f"} : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  turnip.output %n8 : tensor<16x16xf32>
}

