# Sourced by device_check.sh: where cuBLAS and the driver library are, for
# llama.cpp's CUDA build.
# CUDA's compiler can come without cuBLAS, which then lives in pip's
# nvidia-cublas package (nvidia/cu13/{include,lib}); CMake's FindCUDAToolkit
# looks only beside nvcc, so name it. Sets CUBLAS_CMAKE_ARGS and CUBLAS_LIB
# (both empty where cuBLAS is beside nvcc); returns 1 where there is none.
# The driver's libcuda.so, which llama.cpp links for virtual memory
# management, may sit outside the toolkit too (a container's driver mount):
# named where found, else VMM is turned off (cudart still loads the driver).
# Extra folders to search: $CUBLAS_SEARCH (space-separated).
find_cublas() {
    CUBLAS_CMAKE_ARGS="" CUBLAS_LIB=""
    local root header inc driver
    root=$(dirname "$(dirname "$(command -v nvcc)")")
    if ! ls "$root"/lib64/libcuda.so* "$root"/lib64/stubs/libcuda.so* > /dev/null 2>&1; then
        driver=$(ls /usr/local/nvidia/lib64/libcuda.so* /usr/lib/x86_64-linux-gnu/libcuda.so* 2>/dev/null | head -1)
        if [ -n "$driver" ]; then CUBLAS_CMAKE_ARGS="-DCUDA_cuda_driver_LIBRARY=$driver"
        else CUBLAS_CMAKE_ARGS="-DGGML_CUDA_NO_VMM=ON"; fi
    fi
    [ -f "$root/include/cublas_v2.h" ] && return 0
    for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))') ${CUBLAS_SEARCH:-}; do
        header=$(find "$sp/nvidia" -maxdepth 3 -name cublas_v2.h 2>/dev/null | head -1)
        [ -n "$header" ] && break
    done
    [ -n "$header" ] || return 1
    inc=$(dirname "$header")
    CUBLAS_LIB=$(dirname "$inc")/lib
    CUBLAS_CMAKE_ARGS+=" -DCUDA_cublas_LIBRARY=$(ls "$CUBLAS_LIB"/libcublas.so* | head -1)"
    CUBLAS_CMAKE_ARGS+=" -DCUDA_cublasLt_LIBRARY=$(ls "$CUBLAS_LIB"/libcublasLt.so* | head -1)"
    CUBLAS_CMAKE_ARGS+=" -DCMAKE_CUDA_FLAGS=-I$inc -DCMAKE_CXX_FLAGS=-I$inc"
}
