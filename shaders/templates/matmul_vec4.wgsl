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
## each operand); @load k kb binds pa, pb: this invocation's vectors of A
## and B at k (B row-major: at its row kb), and pa1 (tall: A's row 64
## further); @outputs opens the epilogue. `o$i` = 16 i, `comp$i` = the
## i-th vector component, `tm` the rows an invocation, `bm` the tile's.
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
let lin = lid.y * 16u + lid.x;
@offsets
#for i in tm
    #for j in 4
        #var c$i$j: f32 = 0.0
        #if dual
            #var d$i$j: f32 = 0.0
        #end
    #end
#end
## This invocation's vector of each tile: A's row lin / 4 at k lin % 4 * 4;
## B's column lin / 4 at the same k, or (row-major) B's row lin / 16 at
## columns lin % 16 * 4.
let kq = (lin % 4u) * 4u;
let ar = wid.y * ${bm}u + lin / 4u;
#if tall
    let ar1 = ar + 64u;
#end
#if b_cols
    let kr = lin / 16u;
    let bc = wid.x * 64u + (lin % 16u) * 4u;
#else
    let bc = wid.x * 64u + lin / 4u;
#end
@load kq kr
var pa = $pa;
#if tall
    var pa1 = $pa1;
#end
var pb = $pb;
#if dual
    var pb2 = $pb2;
#end
for (var t0 = 0u; t0 < $kk; t0 = t0 + 16u) {
    ta[(lin / 4u) * 5u + lin % 4u] = pa;
    #if tall
        ta[(lin / 4u + 64u) * 5u + lin % 4u] = pa1;
    #end
    #if b_cols
        tb[(lin / 16u) * 17u + lin % 16u] = pb;
        #if dual
            tb2[(lin / 16u) * 17u + lin % 16u] = pb2;
        #end
    #else
        tb[(lin / 4u) * 5u + lin % 4u] = pb;
        #if dual
            tb2[(lin / 4u) * 5u + lin % 4u] = pb2;
        #end
    #end
    workgroupBarrier();
    if (t0 + 16u < $kk) {
        let kn = t0 + 16u + kq;
        #if b_cols
            let kbn = t0 + 16u + kr;
        #end
        @load kn kbn
        pa = $pa;
        #if tall
            pa1 = $pa1;
        #end
        pb = $pb;
        #if dual
            pb2 = $pb2;
        #end
    }
    for (var q = 0u; q < 4u; q = q + 1u) {
        #for i in tm
            let a$i = ta[(lid.y + ${o$i}u) * 5u + q];
        #end
        #if b_cols
            ## This invocation's columns are 4 lid.x .. 4 lid.x + 3: one
            ## vector of B's row for each of the four k.
            #for k in 4
                let b$k = tb[(q * 4u + ${k}u) * 17u + lid.x];
                #for i in tm
                    #for j in 4
                        ${c$i$j} = fma(a$i.${comp$k}, b$k.${comp$j}, ${c$i$j});
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
            #for j in 4
                let b$j = tb[(lid.x + ${o$j}u) * 5u + q];
            #end
            #for i in tm
                #for j in 4
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
