// new_group() and DeviceMesh with ranks as threads: every rank's real Gloo groups over one
// in-memory store; results checked by collectives over the groups made.
#include <gtest/gtest.h>

#include <atomic>

#include "dtrain/collectives.h"
#include "dtrain/error.h"
#include "dtrain/mesh.h"
#include "support/thread_group.h"

namespace dtrain {
namespace {

// test::run_ranks, plus a barrier after fn so no rank tears its groups down while a peer is
// still connecting to them.
void run_ranks_synced(int world, const std::function<void(std::shared_ptr<ProcessGroup>)>& fn) {
  test::run_ranks(world, [&](std::shared_ptr<ProcessGroup> g) {
    fn(g);
    g->barrier();
  });
}

int sum_over(const std::shared_ptr<ProcessGroup>& g, int value) {
  torch::Tensor t = torch::tensor({value}, torch::kInt64);
  AllReduceOptions o;
  o.group = g;
  all_reduce(t, o);
  return static_cast<int>(t.item<int64_t>());
}

void NewGroup_MembersGetAGroupInSortedRankOrderOthersGetNull() {
  std::atomic<int> members{0};
  run_ranks_synced(4, [&](std::shared_ptr<ProcessGroup> world) {
    NewGroupOptions o;
    o.parent = world;
    auto even = new_group({2, 0}, o);
    auto tail = new_group({1, 2, 3}, o);
    const int r = world->rank();
    if (r % 2 == 0) {
      ASSERT_TRUE(even);
      EXPECT_EQ(even->world_size(), 2);
      EXPECT_EQ(even->rank(), r / 2);
      // Broadcast from the sub-group's rank 1 (world rank 2).
      torch::Tensor t = torch::tensor({r * 10 + 1}, torch::kInt64);
      BroadcastOptions b;
      b.group = even;
      b.src = 1;
      broadcast(t, b);
      EXPECT_EQ(t.item<int64_t>(), 21);
      ++members;
    } else {
      EXPECT_FALSE(even);
    }
    if (r >= 1) {
      ASSERT_TRUE(tail);
      EXPECT_EQ(tail->rank(), r - 1);
      EXPECT_EQ(sum_over(tail, r), 1 + 2 + 3);
    } else {
      EXPECT_FALSE(tail);
    }
    // The parent still works after its sub-groups were made.
    EXPECT_EQ(sum_over(world, 1), 4);
  });
  EXPECT_EQ(members.load(), 2);
}

void NewGroup_BadRankListsAreUsageErrors() {
  run_ranks_synced(2, [](std::shared_ptr<ProcessGroup> world) {
    NewGroupOptions o;
    o.parent = world;
    EXPECT_THROW(new_group({}, o), UsageError);
    EXPECT_THROW(new_group({0, 0}, o), UsageError);
    try {
      new_group({0, 2}, o);
      ADD_FAILURE() << "rank 2 of a 2-rank group was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2 is outside the parent group (ranks 0-1)"),
                std::string::npos)
          << e.what();
    }
  });
}

void DeviceMesh_ThreeDimensionsOnEightRanksTpFastest() {
  run_ranks_synced(8, [](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh mesh({{"dp", 2}, {"pp", 2}, {"tp", 2}}, world);
    const int r = world->rank();
    // Megatron's layout: rank = dp*4 + pp*2 + tp.
    EXPECT_EQ(mesh.coordinate("dp"), r / 4);
    EXPECT_EQ(mesh.coordinate("pp"), (r / 2) % 2);
    EXPECT_EQ(mesh.coordinate("tp"), r % 2);
    EXPECT_EQ(mesh.rank_at(mesh.coordinates()), r);
    EXPECT_EQ(mesh.group_ranks("tp"), (std::vector<int>{r - r % 2, r - r % 2 + 1}));
    EXPECT_EQ(mesh.group_ranks("dp"), (std::vector<int>{r % 4, r % 4 + 4}));
    for (const char* dim : {"dp", "pp", "tp"}) {
      const auto& g = mesh.group(dim);
      ASSERT_TRUE(g) << dim;
      EXPECT_EQ(g->world_size(), 2) << dim;
      EXPECT_EQ(g->rank(), mesh.coordinate(dim)) << dim;
      // Summing the global ranks over the group gives the sum of group_ranks(dim).
      auto ranks = mesh.group_ranks(dim);
      EXPECT_EQ(sum_over(g, r), ranks[0] + ranks[1]) << dim;
    }
    EXPECT_THROW(mesh.size("ep"), UsageError);
  });
}

void DeviceMesh_SizeOneDimensionsAndWrongProducts() {
  run_ranks_synced(2, [](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh mesh({{"dp", 1}, {"pp", 2}, {"tp", 1}}, world);
    EXPECT_EQ(mesh.group("tp")->world_size(), 1);
    EXPECT_EQ(mesh.group("pp")->world_size(), 2);
    EXPECT_EQ(mesh.coordinate("pp"), world->rank());
    try {
      DeviceMesh bad({{"dp", 3}, {"tp", 2}}, world);
      ADD_FAILURE() << "a 3x2 mesh over 2 ranks was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("dp=3 x tp=2 makes 6 ranks but the group has 2"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(DeviceMesh({{"dp", 2}, {"dp", 1}}, world), UsageError);
    EXPECT_THROW(DeviceMesh({{"dp", 0}, {"tp", 2}}, world), UsageError);
  });
}

// One process for all of them: loading libtorch costs more than the tests.
TEST(MeshAndGroups, NewGroupAndDeviceMesh) {
  {
    SCOPED_TRACE("NewGroup.MembersGetAGroupInSortedRankOrderOthersGetNull");
    NewGroup_MembersGetAGroupInSortedRankOrderOthersGetNull();
  }
  {
    SCOPED_TRACE("NewGroup.BadRankListsAreUsageErrors");
    NewGroup_BadRankListsAreUsageErrors();
  }
  {
    SCOPED_TRACE("DeviceMesh.ThreeDimensionsOnEightRanksTpFastest");
    DeviceMesh_ThreeDimensionsOnEightRanksTpFastest();
  }
  {
    SCOPED_TRACE("DeviceMesh.SizeOneDimensionsAndWrongProducts");
    DeviceMesh_SizeOneDimensionsAndWrongProducts();
  }
}

}  // namespace
}  // namespace dtrain
