## The GPU matrix product C = A B (engine/src/codegen/matmul.rs,
## `tiled_product`, fills the holes): a ${bm}x64 output tile per workgroup
## of 16x16 invocations, each accumulating a ${tm}x4 block in registers
## (rows and columns strided by 16, so workgroup-memory reads are
## broadcasts or consecutive), K in steps of 16 through workgroup memory.
## ta[k * (bm + 1) + row], tb[k * 65 + col]: rows padded by one so the
## invocations storing one row's 16 k values hit 16 banks.
##
## Holes: @offsets binds aoff, boff (the batch entry's first element of
## each operand); @tile_a / @tile_b load this K step's tiles (vec4 loads
## where the operand is laid out for them, else element by element with
## fused producers, along whichever operand dimension is contiguous, so
## global reads coalesce for row-major and transposed operands alike);
## @outputs opens the epilogue. `o$i` = 16 i.
##
## `dual`: a twin product (the same A, its own B) accumulated alongside
## in `d$i$j` from a third tile `tb2` (@tile_b2): SwiGLU's gate and up
## projections in one pass over A.
#shared var<workgroup> ta: array<$at, $ta_len>;
#shared var<workgroup> tb: array<$at, $tb_len>;
#if dual
    #shared var<workgroup> tb2: array<$at, $tb_len>;
#end
let bz = wid.z;
let lin = lid.y * 16u + lid.x;
@offsets
#for i in tm
    #for j in 4
        #var c$i$j: $at = $zero
        #if dual
            #var d$i$j: $at = $zero
        #end
    #end
#end
for (var t0 = 0u; t0 < $kk; t0 = t0 + 16u) {
    @tile_a
    @tile_b
    #if dual
        @tile_b2
    #end
    workgroupBarrier();
    for (var q = 0u; q < 16u; q = q + 1u) {
        #for i in tm
            let a$i = ta[q * $sa + lid.y + ${o$i}u];
        #end
        #for j in 4
            let b$j = tb[q * 65u + lid.x + ${o$j}u];
        #end
        #for i in tm
            #for j in 4
                ${c$i$j} = ${c$i$j} + a$i * b$j;
            #end
        #end
        #if dual
            #for j in 4
                let e$j = tb2[q * 65u + lid.x + ${o$j}u];
            #end
            #for i in tm
                #for j in 4
                    ${d$i$j} = ${d$i$j} + a$i * e$j;
                #end
            #end
        #end
    }
    workgroupBarrier();
}
@outputs
