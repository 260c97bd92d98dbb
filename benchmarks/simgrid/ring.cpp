/* Hand-written peer of benchmarks/sim_at_scale.py: the same ring all-reduce on SimGrid (s4u).
 *
 * p actors, one per host of the platform file the benchmark writes (a cluster of private
 * 1 GB/s links, 10 µs from host to host). Every actor runs 2(p - 1) steps; in each it sends
 * nbytes/p bytes to its right neighbour and receives as much from its left one, and waits for
 * both: the messages of dsml's ring all-reduce (reduce-scatter then all-gather), sizes only.
 *
 * Prints one line: ranks, messages, simulated seconds, wall seconds of the simulation.
 *   ring PLATFORM.xml NBYTES [--cfg=...]   (the benchmark passes CM02 and raw contexts)
 */
#include <simgrid/s4u.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace sg4 = simgrid::s4u;

static std::vector<sg4::Mailbox*> mailboxes;
static std::vector<sg4::Host*> hosts;

static void rank(int r, int p, double chunk)
{
  sg4::Mailbox* mine  = mailboxes[r];
  sg4::Mailbox* right = mailboxes[(r + 1) % p];
  static int token;
  for (int step = 0; step < 2 * (p - 1); step++) {
    int* got = nullptr;
    sg4::CommPtr send = right->put_async(&token, static_cast<uint64_t>(chunk));
    sg4::CommPtr recv = mine->get_async<int>(&got);
    send->wait();
    recv->wait();
  }
}

int main(int argc, char* argv[])
{
  sg4::Engine e(&argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s PLATFORM.xml NBYTES [--cfg=...]\n", argv[0]);
    return 2;
  }
  e.load_platform(argv[1]);
  const double nbytes = std::strtod(argv[2], nullptr);
  hosts = e.get_all_hosts();
  // Hosts in rank order: h0, h1, … (get_all_hosts has no order we may rely on).
  std::vector<sg4::Host*> ordered(hosts.size());
  for (auto* h : hosts)
    ordered[std::stoi(h->get_name().substr(1))] = h;
  hosts = ordered;
  const int p = static_cast<int>(hosts.size());
  for (int r = 0; r < p; r++)
    mailboxes.push_back(sg4::Mailbox::by_name("rank" + std::to_string(r)));
  const double chunk = nbytes / p;        // the benchmark passes nbytes divisible by p
  for (int r = 0; r < p; r++)
    sg4::Actor::create("rank" + std::to_string(r), hosts[r], rank, r, p, chunk);

  auto start = std::chrono::steady_clock::now();
  e.run();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  long long messages = 2LL * (p - 1) * p;
  std::printf("ranks %d messages %lld simulated %.9f wall %.6f\n", p, messages,
              sg4::Engine::get_clock(), wall);
  return 0;
}
