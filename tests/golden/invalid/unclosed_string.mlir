// A stray quote: xDSL 0.74's lexer backtracks exponentially on it; turnip-opt reports it at once.
builtin.module attributes {turnip.devices = 1 : i64} {
  %a, %at = turnip.input on 0 : tensor<8x16xf32>
  %b, %bt = turnip.input on 0 : tensor<16x4xf32>
  %c, %ct = turnip.input on 0 : tensor<8x4xf32>
  %row, %rowt = turnip.input on 0 : tensor<4xf32>
  %mm, %mmt = turnip.matmul %a, %b on 0 : " tensor<16x4xf32>) -> tensor<8x4xf32>
  %es, %est = turnip.einsum %a, %b on 0 {equation = "ij,jk->ki"} : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<4x8xf32>
  %sum, %sumt = turnip.add %mm, %c on 0 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  %bc, %bct = turnip.add %mm, %row on 0 : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  %diff, %difft = turnip.sub %sum, %c on 0 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  %prod, %prodt = turnip.mul %diff, %bc on 0 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  %r, %rt = turnip.relu %prod on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %g, %gt = turnip.gelu %r on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %s, %st = turnip.silu %g on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %e, %et = turnip.exp %s on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %half, %halft = turnip.scale %e on 0 {factor = 5.000000e-01 : f64} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %sm, %smt = turnip.softmax %half on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %n, %nt = turnip.rmsnorm %sm on 0 : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %ne, %net = turnip.rmsnorm %n on 0 {eps = 1.000000e-05 : f64} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %nw, %nwt = turnip.rmsnorm %ne, %row on 0 {eps = 1.000000e-06 : f64} : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  turnip.output %es, %nw : tensor<4x8xf32>, tensor<8x4xf32>
}
