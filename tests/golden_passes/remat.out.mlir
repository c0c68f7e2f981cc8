builtin.module attributes {turnip.devices = 1 : i64, turnip.budget = 16777216 : i64} {
  %x, %xt = turnip.input at <0, 0, 4194304> : tensor<1024x1024xf32>
  %a, %at = turnip.relu %x at <0, 4194304, 4194304> : (tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  %b, %bt = turnip.scale %x at <0, 8388608, 4194304> {factor = 5.000000e-01 : f64} : (tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  %c, %ct = turnip.add %a, %b at <0, 12582912, 4194304> : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  %d, %dt = turnip.mul %c, %x at <0, 8388608, 4194304> redundant[%bt, %ct] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  %e, %et = turnip.add %d, %a at <0, 12582912, 4194304> redundant[%ct, %dt] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  %b_1, %bt_1 = turnip.scale %x at <0, 4194304, 4194304> after[%et] {task = "b", factor = 5.000000e-01 : f64} : (tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  %f, %ft = turnip.add %e, %b_1 at <0, 8388608, 4194304> redundant[%dt, %et] : (tensor<1024x1024xf32>, tensor<1024x1024xf32>) -> tensor<1024x1024xf32>
  turnip.output %f : tensor<1024x1024xf32>
}

