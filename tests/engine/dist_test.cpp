// engine/dist without MPI: the bucketed gradient all-reduce packs and unpacks every gradient
// exactly (a fake communicator stands in for the other ranks), buckets respect their size and
// dtype, and the replica checksum and its cross-rank check catch a one-ulp difference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/dist/grad_sync.h"

namespace kv {
namespace {

// Rank 0 of `n` ranks whose peers each contribute `peer` to every element of a sum.
class FakeComm final : public dist::Communicator {
   public:
    FakeComm(int n, double peer) : n_(n), peer_(peer) {}
    const char* backend() const override { return "fake"; }
    int rank() const override { return 0; }
    int size() const override { return n_; }
    std::string host() const override { return "here"; }
    void allreduce_sum(void* data, size_t count, dist::ReduceType type, const char*) override {
        calls.push_back({count, type});
        for (size_t i = 0; i < count; ++i) {
            if (type == dist::ReduceType::F32) static_cast<float*>(data)[i] += float(peer_ * (n_ - 1));
            else if (type == dist::ReduceType::F64) static_cast<double*>(data)[i] += peer_ * (n_ - 1);
        }
    }
    void broadcast(void*, size_t, int, const char*) override {}
    std::vector<uint64_t> allgather_u64(uint64_t v, const char*) override {
        std::vector<uint64_t> all(size_t(n_), v);
        if (differ_rank > 0) all[size_t(differ_rank)] = v + 1;
        return all;
    }
    void barrier(const char*) override {}
    std::vector<std::pair<size_t, dist::ReduceType>> calls;
    int differ_rank = -1;

   private:
    int n_;
    double peer_;
};

Tensor ramp(int64_t n, DType dt, double start) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + 0.25 * double(i);
    return Tensor::from_f64({n}, v, dt);
}

TEST(DistGradSync, EveryElementGetsThePeersSumAcrossBucketsAndDtypes) {
    // 3 f32 tensors (1000, 3000, 500 elements), then an f64 one: with 8 KiB buckets the f32
    // ones need one bucket each (4000 + 12000 + 2000 bytes), the f64 tensor its own.
    std::vector<Tensor> ts = {ramp(1000, DType::F32, 1), ramp(3000, DType::F32, -7), ramp(500, DType::F32, 3), ramp(700, DType::F64, 0.5)};
    std::vector<std::vector<double>> before;
    std::vector<Tensor*> ptrs;
    for (auto& t : ts) before.push_back(t.to_f64_vector()), ptrs.push_back(&t);
    FakeComm comm(4, 0.5);  // three peers add 1.5 to every element
    dist::GradSync sync(comm, ptrs, 8192);
    const dist::GradSyncStats st = sync.allreduce();
    for (size_t k = 0; k < ts.size(); ++k) {
        const auto after = ts[k].to_f64_vector();
        ASSERT_EQ(after.size(), before[k].size());
        for (size_t i = 0; i < after.size(); ++i) ASSERT_EQ(after[i], before[k][i] + 1.5) << "tensor " << k << " element " << i;
    }
    size_t elems = 0;
    for (const auto& [count, type] : comm.calls) {
        elems += count;
        EXPECT_TRUE(count * dist::reduce_type_size(type) <= 8192 || count == 3000) << count;  // only the 12 KB tensor exceeds a bucket alone
    }
    EXPECT_EQ(elems, size_t(1000 + 3000 + 500 + 700));
    EXPECT_EQ(st.buckets, int64_t(comm.calls.size()));
    EXPECT_EQ(st.bytes, size_t((1000 + 3000 + 500) * 4 + 700 * 8));
    ASSERT_EQ(comm.calls.back().second, dist::ReduceType::F64);  // dtypes never share a bucket
    EXPECT_EQ(comm.calls.back().first, 700u);
}

// A fake whose non-blocking sums are applied only at wait_started (as a real one completes
// them), recording the order of starts and waits.
class DeferredComm final : public dist::Communicator {
   public:
    const char* backend() const override { return "fake"; }
    int rank() const override { return 0; }
    int size() const override { return 2; }
    std::string host() const override { return "here"; }
    void allreduce_sum(void*, size_t, dist::ReduceType, const char*) override { log.push_back("blocking"); }
    void start_allreduce_sum(void* data, size_t count, dist::ReduceType, const char*) override {
        log.push_back("start " + std::to_string(count));
        pending.push_back({static_cast<float*>(data), count});
    }
    void wait_started() override {
        log.push_back("wait");
        for (auto [p, n] : pending)
            for (size_t i = 0; i < n; ++i) p[i] += 10.0f;  // the peer's contribution
        pending.clear();
    }
    void broadcast(void*, size_t, int, const char*) override {}
    std::vector<uint64_t> allgather_u64(uint64_t v, const char*) override { return {v, v}; }
    void barrier(const char*) override {}
    std::vector<std::string> log;
    std::vector<std::pair<float*, size_t>> pending;
};

TEST(DistGradSync, OverlapStartsBucketsTopLayerFirstAsLayersFinish) {
    // Gradients of layers 0, 1, 1, (none), 0; 100 floats each; 800-byte buckets hold two.
    // Buckets top layer first: {layer 1, layer 1}, {layer 0, layer 0}, {layer-less}.
    std::vector<Tensor> ts;
    for (int k = 0; k < 5; ++k) ts.push_back(ramp(100, DType::F32, double(k)));
    std::vector<Tensor*> ptrs;
    std::vector<std::vector<double>> before;
    for (auto& t : ts) ptrs.push_back(&t), before.push_back(t.to_f64_vector());
    DeferredComm comm;
    dist::GradSync sync(comm, ptrs, 800, {0, 1, 1, -1, 0});
    sync.layers_final(2);  // nothing is final yet
    EXPECT_TRUE(comm.log.empty());
    sync.layers_final(1);  // layer 1 done: its bucket starts
    EXPECT_EQ(comm.log, (std::vector<std::string>{"start 200"}));
    sync.layers_final(0);  // layer 0 done: its bucket; the layer-less one waits for finish
    EXPECT_EQ(comm.log, (std::vector<std::string>{"start 200", "start 200"}));
    const dist::GradSyncStats st = sync.finish();
    EXPECT_EQ(comm.log, (std::vector<std::string>{"start 200", "start 200", "start 100", "wait"}));
    EXPECT_EQ(st.buckets, 3);
    EXPECT_EQ(st.overlapped, 2);
    for (size_t k = 0; k < ts.size(); ++k) {
        const auto after = ts[k].to_f64_vector();
        for (size_t i = 0; i < after.size(); ++i) ASSERT_EQ(after[i], before[k][i] + 10.0) << "tensor " << k << " element " << i;
    }
    // The next step starts over: nothing started until a layer is reported again.
    comm.log.clear();
    const dist::GradSyncStats again = sync.finish();
    EXPECT_EQ(again.overlapped, 0);
    EXPECT_EQ(comm.log, (std::vector<std::string>{"start 200", "start 200", "start 100", "wait"}));
}

TEST(DistGradSync, LayerOfAParameterName) {
    EXPECT_EQ(dist::GradSync::layer_of_name("base_model.model.model.layers.12.self_attn.q_proj.lora_A.weight"), 12);
    EXPECT_EQ(dist::GradSync::layer_of_name("model.layers.0.mlp.up_proj.weight"), 0);
    EXPECT_EQ(dist::GradSync::layer_of_name("model.embed_tokens.weight"), -1);
    EXPECT_EQ(dist::GradSync::layer_of_name("model.norm.weight"), -1);
    EXPECT_EQ(dist::GradSync::layer_of_name("score.weight"), -1);
    EXPECT_EQ(dist::GradSync::layer_of_name("layers.x.weight"), -1);
}

TEST(DistChecksum, OneUlpInOneTensorChangesItAndTheRanksCheckNamesTheRank) {
    Tensor a = ramp(257, DType::F32, 1), b = ramp(33, DType::F32, 2);
    Tensor a2 = a.clone(), b2 = b.clone();
    const uint64_t h = dist::checksum_tensors({&a, &b});
    EXPECT_EQ(h, dist::checksum_tensors({&a2, &b2}));
    EXPECT_NE(h, dist::checksum_tensors({&b, &a}));  // order is part of it
    float* p = b2.data<float>();
    p[17] = std::nextafter(p[17], 1e30f);
    EXPECT_NE(h, dist::checksum_tensors({&a2, &b2}));

    FakeComm same(3, 0);
    EXPECT_NO_THROW(dist::check_identical(same, h, "weights"));
    FakeComm drift(3, 0);
    drift.differ_rank = 2;
    try {
        dist::check_identical(drift, h, "weights after step 10");
        FAIL() << "no error for a drifted rank";
    } catch (const dist::DistError& e) {
        EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("weights after step 10"), std::string::npos) << e.what();
    }
}

TEST(DistBackends, NoneIsAlwaysThereAndBadNamesAreRefused) {
    const auto b = dist::available_backends();
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(b.front(), "none");
    dist::DistOptions o;
    o.backend = "gloo";
    try {
        dist::make_communicator(o);
        FAIL() << "gloo accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("expected auto, none, mpi or nccl"), std::string::npos) << e.what();
    }
    o.backend = "none";
    auto c = dist::make_communicator(o);
    EXPECT_EQ(c->size(), 1);
    float x = 3;
    c->allreduce_sum(&x, 1, dist::ReduceType::F32, "t");
    EXPECT_EQ(x, 3.0f);
}

}  // namespace
}  // namespace kv
