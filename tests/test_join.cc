// A server's admission of workers (JoinDesk): every refusal names its
// cause, ranks follow JOIN order, a worker that leaves before the job frees
// its place, and the WELCOME carries the first JOIN's layout.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dblp/control/join.h"
#include "dblp/wire/chunking.h"

namespace dblp {
namespace {

JoinMsg Join(const std::string& name, uint64_t bytes = 4096,
             uint32_t mtu = 1500) {
  JoinMsg j;
  j.worker_name = name;
  j.total_bytes = bytes;
  j.mtu = mtu;
  j.layers = {LayerInfo{"fc", {32, 32}}};
  return j;
}

TEST(JoinDesk, AdmitsInOrderUntilFull) {
  JoinDesk desk(JoinPolicy{2, 1500, 1 << 20});
  EXPECT_EQ(desk.Admit(11, Join("a")), "");
  EXPECT_EQ(desk.Admit(12, Join("b")), "");
  EXPECT_TRUE(desk.full());
  EXPECT_EQ(desk.RankOf(11), 0);
  EXPECT_EQ(desk.RankOf(12), 1);
  EXPECT_EQ(desk.RankOf(13), -1);
  EXPECT_EQ(desk.Admit(13, Join("c")), "job already has all workers");
  EXPECT_EQ(desk.members()[1].name, "b");
}

TEST(JoinDesk, EveryRefusalNamesItsCause) {
  JoinDesk desk(JoinPolicy{3, 1500, 1 << 20});
  JoinMsg old = Join("v");
  old.protocol_version = 1;
  EXPECT_NE(desk.Admit(1, old).find("protocol version 1"), std::string::npos);
  EXPECT_NE(desk.Admit(1, Join("z", 0)).find("multiple of 4"),
            std::string::npos);
  EXPECT_NE(desk.Admit(1, Join("odd", 4097)).find("multiple of 4"),
            std::string::npos);
  EXPECT_NE(desk.Admit(1, Join("big", 2 << 20)).find("limit"),
            std::string::npos);
  EXPECT_NE(desk.Admit(1, Join("jumbo", 4096, 9000)).find("--mtu"),
            std::string::npos);
  ASSERT_EQ(desk.Admit(1, Join("a")), "");
  EXPECT_EQ(desk.Admit(1, Join("a")), "JOIN sent twice");
  EXPECT_NE(desk.Admit(2, Join("b", 8192)).find("layout differs"),
            std::string::npos);
  JoinMsg other = Join("c");
  other.layers[0].shape = {32, 16};
  EXPECT_NE(desk.Admit(3, other).find("same model"), std::string::npos);
  EXPECT_EQ(desk.members().size(), 1u);  // nothing refused was admitted
}

TEST(JoinDesk, LeavingBeforeTheJobFreesThePlace) {
  JoinDesk desk(JoinPolicy{2, 1500, 1 << 20});
  ASSERT_EQ(desk.Admit(1, Join("a")), "");
  ASSERT_EQ(desk.Admit(2, Join("b")), "");
  desk.Leave(1);
  EXPECT_EQ(desk.RankOf(2), 0);
  EXPECT_EQ(desk.Admit(3, Join("c")), "");
  EXPECT_EQ(desk.RankOf(3), 1);
  desk.Close();
  desk.Leave(3);  // after the job started the rank stays
  EXPECT_EQ(desk.RankOf(3), 1);
  EXPECT_EQ(desk.Admit(4, Join("d")), "job already has all workers");
}

TEST(JoinDesk, RankByNameOrdersMembersNaturallyAtClose) {
  JoinPolicy policy{4, 1500, 1 << 20};
  policy.rank_by_name = true;
  JoinDesk desk(policy);
  ASSERT_EQ(desk.Admit(1, Join("rank10")), "");
  ASSERT_EQ(desk.Admit(2, Join("rank2")), "");
  ASSERT_EQ(desk.Admit(3, Join("rank0")), "");
  ASSERT_EQ(desk.Admit(4, Join("rank1")), "");
  EXPECT_EQ(desk.RankOf(1), 0);  // join order until the job starts
  desk.Close();
  EXPECT_EQ(desk.RankOf(3), 0);
  EXPECT_EQ(desk.RankOf(4), 1);
  EXPECT_EQ(desk.RankOf(2), 2);
  EXPECT_EQ(desk.RankOf(1), 3);
  EXPECT_EQ(desk.members()[3].name, "rank10");
}

TEST(JoinDesk, ShortfallCountsThoseWhoJoinedAndLeft) {
  JoinDesk desk(JoinPolicy{3, 1500, 1 << 20});
  EXPECT_EQ(desk.Shortfall(), "only 0 of 3 workers joined");
  ASSERT_EQ(desk.Admit(1, Join("a")), "");
  ASSERT_EQ(desk.Admit(2, Join("b")), "");
  EXPECT_EQ(desk.Shortfall(), "only 2 of 3 workers joined");
  desk.Leave(1);
  desk.Leave(2);
  EXPECT_EQ(desk.Shortfall(),
            "only 0 of 3 workers joined (2 had joined; the others left "
            "again, e.g. at their own --join_timeout_ms)");
}

TEST(JoinDesk, JoinOrderIsTheDefault) {
  JoinDesk desk(JoinPolicy{2, 1500, 1 << 20});
  ASSERT_EQ(desk.Admit(1, Join("w9")), "");
  ASSERT_EQ(desk.Admit(2, Join("w1")), "");
  desk.Close();
  EXPECT_EQ(desk.RankOf(1), 0);
  EXPECT_EQ(desk.RankOf(2), 1);
}

TEST(JoinDesk, NaturalNameOrder) {
  EXPECT_TRUE(JoinDesk::NameBefore("w2", "w10"));
  EXPECT_FALSE(JoinDesk::NameBefore("w10", "w2"));
  EXPECT_TRUE(JoinDesk::NameBefore("a9", "b1"));  // prefixes first
  EXPECT_TRUE(JoinDesk::NameBefore("w", "w0"));
  EXPECT_TRUE(JoinDesk::NameBefore("w007", "w8"));
  EXPECT_TRUE(JoinDesk::NameBefore("w07", "w7"));  // a tie, then text order
  EXPECT_FALSE(JoinDesk::NameBefore("w7", "w07"));
  // A strict weak ordering over mixed names (the review's cycle).
  EXPECT_TRUE(JoinDesk::NameBefore("a9", "a10"));
  const std::vector<std::string> names = {"a9", "a10", "a1x", "b", "a",
                                          "a01", "a1", "x7y", "rank3"};
  for (const auto& x : names) {
    EXPECT_FALSE(JoinDesk::NameBefore(x, x)) << x;
    for (const auto& y : names) {
      if (JoinDesk::NameBefore(x, y)) {
        EXPECT_FALSE(JoinDesk::NameBefore(y, x));
      }
      for (const auto& z : names) {
        if (JoinDesk::NameBefore(x, y) && JoinDesk::NameBefore(y, z)) {
          EXPECT_TRUE(JoinDesk::NameBefore(x, z)) << x << " " << y << " " << z;
        }
      }
    }
  }
}

TEST(JoinDesk, WelcomeCarriesTheFirstJoinsLayout) {
  JoinDesk desk(JoinPolicy{2, 1500, 1 << 20});
  ASSERT_EQ(desk.Admit(1, Join("a", 40000)), "");
  ASSERT_EQ(desk.Admit(2, Join("b", 40000)), "");
  const WelcomeMsg w = desk.Welcome(1, 1452);
  EXPECT_EQ(w.rank, 1u);
  EXPECT_EQ(w.num_workers, 2u);
  EXPECT_EQ(w.total_bytes, 40000u);
  EXPECT_EQ(w.chunk_payload, 1452u);
  EXPECT_EQ(w.num_chunks, ChunkLayout(40000, 1452).num_chunks());
  EXPECT_EQ(w.layers, desk.first().layers);
  EXPECT_EQ(w.mtu, 1500u);
}

}  // namespace
}  // namespace dblp
