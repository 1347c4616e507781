## Partial results of a row's lanes combined (a sum, or with `max` a
## maximum) so that every lane gets the row's result: engine/src/codegen/
## reduction.rs, `row_reduce`. A row's `lanes` are consecutive invocations;
## `red` (workgroup memory) holds 64 floats per partial (`red$p` = 64 p).
## Barriers are reached by every invocation (uniform control flow).
##
## In: `parts` partials `part$p`, the invocation's `lane`; out: `res$p`.
#if subgroup
    ## Butterfly shuffles combine blocks of up to the subgroup size (native
    ## WGSL through naga takes subgroup builtins without `enable`); with
    ## `split`, workgroup memory then combines the row's blocks.
    #for p in parts
        #var r$p: f32 = ${part$p}
    #end
    #for mask in masks
        #for p in parts
            #if max
                ${r$p} = max(${r$p}, subgroupShuffleXor(${r$p}, ${mask}u));
            #else
                ${r$p} = ${r$p} + subgroupShuffleXor(${r$p}, ${mask}u);
            #end
        #end
    #end
    #if split
        #for p in parts
            if (lid.x % ${block}u == 0u) { red[${red$p}u + lid.x / ${block}u] = ${r$p}; }
        #end
        workgroupBarrier();
        #let first: u32 = (lid.x - $lane) / ${block}u
        #for p in parts
            #set acc = red[${red$p}u + $first]
            #for b in later_blocks
                #if max
                    #set acc = max($acc, red[${red$p}u + $first + ${b}u])
                #else
                    #set acc = $acc + red[${red$p}u + $first + ${b}u]
                #end
            #end
            #let res$p: f32 = $acc
        #end
        workgroupBarrier();
    #else
        #for p in parts
            #set res$p = ${r$p}
        #end
    #end
#else
    ## A tree over `red`: `lanes / 2` partners, then half as many, ...
    #for p in parts
        red[${red$p}u + lid.x] = ${part$p};
    #end
    workgroupBarrier();
    #for s in strides
        #set steps =
        #for p in parts
            #if max
                #set step = red[${red$p}u + lid.x] = max(red[${red$p}u + lid.x], red[${red$p}u + lid.x + ${s}u]);
            #else
                #set step = red[${red$p}u + lid.x] = red[${red$p}u + lid.x] + red[${red$p}u + lid.x + ${s}u];
            #end
            #set steps = $steps $step
        #end
        if ($lane < ${s}u) {$steps }
        workgroupBarrier();
    #end
    #for p in parts
        #let res$p: f32 = red[${red$p}u + lid.x - $lane]
    #end
    ## Later reductions reuse `red`.
    workgroupBarrier();
#end
