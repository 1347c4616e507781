## The GPU matrix product C = A B with vec4 tiles (engine/src/codegen/
## matmul.rs, `tiled_vec4_product`, fills the holes): a 64x64 output tile
## per workgroup of 16x16 invocations, each accumulating a 4x4 block in
## registers (`c$i$j`), K in steps of 16 through workgroup memory held as
## vectors of four k: each invocation loads one vector of A's tile and one
## of B's per step (64-row tiles of f32: the scalar layout takes 32 reads).
## The next K step's loads are issued into registers before this one is
## computed, hiding their latency. An H100 ran `linear` 4096x384x1536 in
## 0.220 ms this way, 0.336 in the scalar layout.
##
## A vector of four k is 5 apart per row or column: the 8 invocations of a
## 128-bit access phase reading B's columns lid.x..lid.x+7 hit distinct
## banks (20-word stride); B row-major (`b_cols`: bound as vectors along
## its columns) holds 16 vectors of columns per k, 17 apart.
##
## `tall`: 128-row tiles, each invocation accumulating an 8x4 block and
## loading two vectors of A's tile per step (12 workgroup-memory reads per
## 128 multiply-adds instead of 8 per 64), for products with rows enough
## to fill the GPU with half as many workgroups.
##
## Holes: @offsets binds aoff, boff (the batch entry's first element of
## each operand); @load k kb binds pa$r (r < ra) and pb$s (s < rb): this
## invocation's vectors of A on rows ar$r and of B at k (B row-major: at
## its row kb + bo$s), and pb2, the twin's; @outputs opens the epilogue.
## `o$i` = 16 i, `comp$i` = the i-th vector component, `tm` x `tn` the
## block an invocation (its columns p$j = wx j apart, or B row-major in
## vectors bx$s apart: column j is component cj$j of vector bn$j), `bm`
## the tile's rows, `wx` the workgroup's width.
##
## `wide` (with `tall` only): 8x8 blocks, a workgroup of 8x16
## invocations over the same 128x64 tile, each loading four vectors of A
## and two of B a step; its columns are 8 apart (B row-major: vectors
## lid.x and lid.x + 8 of the tile's 16). 16 multiply-adds a
## workgroup-memory vector read instead of 10.7.
##
## `dual` (never with `tall`: a third tile): a twin product (the same A,
## its own B laid out as B) accumulated alongside in `d$i$j` from tile
## `tb2`, @load binding pb2: SwiGLU's gate and up projections in one pass
## over A.
#shared var<workgroup> ta: array<vec4<f32>, $ta_len>;
#shared var<workgroup> tb: array<vec4<f32>, 320>;
#if dual
    #shared var<workgroup> tb2: array<vec4<f32>, 320>;
#end
let bz = wid.z;
let lin = lid.y * ${wx}u + lid.x;
@offsets
#for i in tm
    #for j in tn
        #var c$i$j: f32 = 0.0
        #if dual
            #var d$i$j: f32 = 0.0
        #end
    #end
#end
## This invocation's vectors of each tile: A's rows lin / 4 + ao$r at k
## lin % 4 * 4; B's columns lin / 4 + bco$s at the same k, or (row-major)
## B's rows lin / 16 + bo$s at columns lin % 16 * 4.
let kq = (lin % 4u) * 4u;
let arb = wid.y * ${bm}u + lin / 4u;
#for r in ra
    let ar$r = arb + ${ao$r}u;
#end
#if b_cols
    let kr = lin / 16u;
    let bc0 = wid.x * 64u + (lin % 16u) * 4u;
#else
    #for s in rb
        let bc$s = wid.x * 64u + lin / 4u + ${bco$s}u;
    #end
#end
@load kq kr
#for r in ra
    var pa$r = ${pa$r};
#end
#for s in rb
    var pb$s = ${pb$s};
#end
#if dual
    var pd = $pb2;
#end
for (var t0 = 0u; t0 < $kk; t0 = t0 + 16u) {
    #for r in ra
        ta[(lin / 4u + ${ao$r}u) * 5u + lin % 4u] = pa$r;
    #end
    #if b_cols
        #for s in rb
            tb[(lin / 16u + ${bo$s}u) * 17u + lin % 16u] = pb$s;
        #end
        #if dual
            tb2[(lin / 16u) * 17u + lin % 16u] = pd;
        #end
    #else
        #for s in rb
            tb[(lin / 4u + ${bco$s}u) * 5u + lin % 4u] = pb$s;
        #end
        #if dual
            tb2[(lin / 4u) * 5u + lin % 4u] = pd;
        #end
    #end
    workgroupBarrier();
    if (t0 + 16u < $kk) {
        let kn = t0 + 16u + kq;
        #if b_cols
            let kbn = t0 + 16u + kr;
        #end
        @load kn kbn
        #for r in ra
            pa$r = ${pa$r};
        #end
        #for s in rb
            pb$s = ${pb$s};
        #end
        #if dual
            pd = $pb2;
        #end
    }
    for (var q = 0u; q < 4u; q = q + 1u) {
        #for i in tm
            let a$i = ta[(lid.y + ${o$i}u) * 5u + q];
        #end
        #if b_cols
            ## This invocation's columns are 4 lid.x .. 4 lid.x + 3 (wide:
            ## and 32 further): a vector of B's row for each of the four k.
            #for k in 4
                #for s in rb
                    let b$k$s = tb[(q * 4u + ${k}u) * 17u + lid.x + ${bx$s}u];
                #end
                #for i in tm
                    #for j in tn
                        ${c$i$j} = fma(a$i.${comp$k}, b$k${bn$j}.${cj$j}, ${c$i$j});
                    #end
                #end
                #if dual
                    let e$k = tb2[(q * 4u + ${k}u) * 17u + lid.x];
                    #for i in tm
                        #for j in 4
                            ${d$i$j} = fma(a$i.${comp$k}, e$k.${comp$j}, ${d$i$j});
                        #end
                    #end
                #end
            #end
        #else
            #for j in tn
                let b$j = tb[(lid.x + ${p$j}u) * 5u + q];
            #end
            #for i in tm
                #for j in tn
                    #for k in 4
                        ${c$i$j} = fma(a$i.${comp$k}, b$j.${comp$k}, ${c$i$j});
                    #end
                #end
            #end
            #if dual
                #for j in 4
                    let e$j = tb2[(lid.x + ${o$j}u) * 5u + q];
                #end
                #for i in tm
                    #for j in 4
                        #for k in 4
                            ${d$i$j} = fma(a$i.${comp$k}, e$j.${comp$k}, ${d$i$j});
                        #end
                    #end
                #end
            #end
        #end
    }
    workgroupBarrier();
}
@outputs
