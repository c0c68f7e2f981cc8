builtin.module attributes {turnip.devices = 1 : i64} {
  %a = turnip.input on 0 : tensor<8x16xf32>
  %b = turnip.input on 0 : tensor<16x4xf32>
  %c = turnip.input on 0 : tensor<8x4xf32>
  %row = turnip.input on 0 : tensor<4xf32>
  %mm = turnip.matmul %a, %b on 0 : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  %es = turnip.einsum %a, %b on 0 {equation = "ij,jk->ki"} : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<4x8xf32>
  %sum = turnip.add %mm, %c on 0 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  %bc = turnip.add %mm, %row on 0 : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  %diff = turnip.sub %sum, %c on 0 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  %prod = turnip.mul %diff, %bc on 0 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  %r = turnip.relu %prod on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %g = turnip.gelu %r on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %s = turnip.silu %g on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %e = turnip.exp %s on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %half = turnip.scale %e on 0 {factor = 5.000000e-01 : f64} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %sm = turnip.softmax %half on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %n = turnip.rmsnorm %sm on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %ne = turnip.rmsnorm %n on 0 {eps = 1.000000e-05 : f64} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %nw = turnip.rmsnorm %ne, %row on 0 {eps = 1.000000e-06 : f64} : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  turnip.output %es, %nw : tensor<4x8xf32>, tensor<8x4xf32>
}
