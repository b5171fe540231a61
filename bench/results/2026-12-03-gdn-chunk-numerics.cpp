// Numerics of the chunked GDN decomposition with TF32 products: chunk 64 vs 128, and the
// W/U form (u = U − W·Sᵀ) vs the T·z form (u = T·(βv − X·Sᵀ)). Reference: per-token recurrence
// in double. One value head, K = V = 128, 1024 tokens; keys k = normalise(corr·c + noise) with
// one common direction c (corr 0: independent keys); g = −decay·softplus(a), a ~ U(−3, 2).
// Figures in 2026-12-03-h200-run13.md. Not part of the build:
//   g++ -O2 -o gdn_num 2026-12-03-gdn-chunk-numerics.cpp && ./gdn_num
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

using std::vector;
static int K = 128, V = 128;
static float g_corr = 0.0f;

static float tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x1000u) & 0xffffe000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}
// C[m×n] = A[m×k]·B[k×n] with tf32 operands (or exact float when !t), float accumulation.
static void mm(const float* A, const float* B, float* Cm, int m, int k, int n, bool t, bool acc = false) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float s = acc ? Cm[i * n + j] : 0.0f;
      for (int l = 0; l < k; ++l) s += (t ? tf32(A[i * k + l]) * tf32(B[l * n + j]) : A[i * k + l] * B[l * n + j]);
      Cm[i * n + j] = s;
    }
}

struct Problem {
  int T;
  vector<float> q, k, v, g, beta;  // q, k normalised (q scaled)
};

static Problem make(int T, double decay_scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(-3.0f, 2.0f);
  Problem p;
  p.T = T;
  p.q.resize(T * K);
  p.k.resize(T * K);
  p.v.resize(T * V);
  p.g.resize(T);
  p.beta.resize(T);
  vector<float> common(K);
  for (float& x : common) x = nd(rng);
  for (int t = 0; t < T; ++t) {
    double sq = 0, sk = 0;
    for (int c = 0; c < K; ++c) {
      p.q[t * K + c] = nd(rng);
      p.k[t * K + c] = g_corr * common[c] + nd(rng);
      sq += p.q[t * K + c] * p.q[t * K + c];
      sk += p.k[t * K + c] * p.k[t * K + c];
    }
    for (int c = 0; c < K; ++c) {
      p.q[t * K + c] = static_cast<float>(p.q[t * K + c] / std::sqrt(sq + 1e-6) / std::sqrt(double(K)));
      p.k[t * K + c] = static_cast<float>(p.k[t * K + c] / std::sqrt(sk + 1e-6));
    }
    for (int c = 0; c < V; ++c) p.v[t * V + c] = nd(rng);
    const double a = ud(rng);
    p.g[t] = static_cast<float>(-decay_scale * std::log1p(std::exp(a)));
    p.beta[t] = static_cast<float>(1.0 / (1.0 + std::exp(-double(ud(rng)))));
  }
  return p;
}

static vector<double> reference(const Problem& p, vector<double>& S) {
  S.assign(V * K, 0.0);
  vector<double> out(p.T * V);
  for (int t = 0; t < p.T; ++t) {
    const double d = std::exp(double(p.g[t]));
    for (double& s : S) s *= d;
    for (int r = 0; r < V; ++r) {
      double sk = 0;
      for (int c = 0; c < K; ++c) sk += S[r * K + c] * p.k[t * K + c];
      const double vn = p.beta[t] * (p.v[t * V + r] - sk);
      for (int c = 0; c < K; ++c) S[r * K + c] += vn * p.k[t * K + c];
      double o = 0;
      for (int c = 0; c < K; ++c) o += S[r * K + c] * p.q[t * K + c];
      out[t * V + r] = o;
    }
  }
  return out;
}

// Chunked, float with tf32 products (t) or exact float products; wu: u = U − W·Sᵀ.
static vector<float> chunked(const Problem& p, int C, bool t, bool wu, vector<float>& S, double& maxT) {
  S.assign(V * K, 0.0f);
  vector<float> out(p.T * V, 0.0f);
  maxT = 0;
  for (int t0 = 0; t0 < p.T; t0 += C) {
    const int n = std::min(C, p.T - t0);
    vector<double> cum(C, 0.0);
    double run = 0;
    for (int i = 0; i < C; ++i) {
      if (i < n) run += p.g[t0 + i];
      cum[i] = run;
    }
    const double cl = cum[n - 1];
    vector<float> Kc(C * K, 0.0f), Qc(C * K, 0.0f), Vc(C * V, 0.0f), KT(K * C, 0.0f);
    for (int i = 0; i < n; ++i) {
      for (int c = 0; c < K; ++c) {
        Kc[i * K + c] = p.k[(t0 + i) * K + c];
        Qc[i * K + c] = p.q[(t0 + i) * K + c];
        KT[c * C + i] = Kc[i * K + c];
      }
      for (int c = 0; c < V; ++c) Vc[i * V + c] = p.v[(t0 + i) * V + c];
    }
    vector<float> G(C * C), Pq(C * C);
    mm(Kc.data(), KT.data(), G.data(), C, K, C, t);
    mm(Qc.data(), KT.data(), Pq.data(), C, K, C, t);
    vector<float> A(C * C, 0.0f), P(C * C, 0.0f);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) {
        const float d = static_cast<float>(std::exp(cum[i] - cum[j]));
        P[i * C + j] = Pq[i * C + j] * d;
        if (j < i) A[i * C + j] = p.beta[t0 + i] * G[i * C + j] * d;
      }
    vector<float> Tm(C * C, 0.0f);
    for (int m = 0; m < C; ++m)
      for (int i = 0; i < C; ++i) {
        float s = i == m ? 1.0f : 0.0f;
        for (int j = 0; j < i; ++j) s -= A[i * C + j] * Tm[j * C + m];
        Tm[i * C + m] = s;
        maxT = std::max(maxT, double(std::fabs(s)));
      }
    vector<float> R(C * C);
    mm(P.data(), Tm.data(), R.data(), C, C, C, t);
    vector<float> xs(C, 0.0f), ks(C, 0.0f), qs(C, 0.0f), bv(C * V, 0.0f);
    for (int i = 0; i < n; ++i) {
      xs[i] = static_cast<float>(p.beta[t0 + i] * std::exp(cum[i]));
      ks[i] = static_cast<float>(std::exp(cl - cum[i]));
      qs[i] = static_cast<float>(std::exp(cum[i]));
      for (int c = 0; c < V; ++c) bv[i * V + c] = p.beta[t0 + i] * Vc[i * V + c];
    }
    // S^T [K × V]
    vector<float> ST(K * V);
    for (int r = 0; r < V; ++r)
      for (int c = 0; c < K; ++c) ST[c * V + r] = S[r * K + c];
    vector<float> kS(C * V), qS(C * V);
    mm(Kc.data(), ST.data(), kS.data(), C, K, V, t);
    mm(Qc.data(), ST.data(), qS.data(), C, K, V, t);
    vector<float> u(C * V);
    if (!wu) {
      vector<float> z(C * V);
      for (int i = 0; i < C; ++i)
        for (int c = 0; c < V; ++c) z[i * V + c] = bv[i * V + c] - xs[i] * kS[i * V + c];
      mm(Tm.data(), z.data(), u.data(), C, C, V, t);
      vector<float> o(C * V);
      mm(R.data(), z.data(), o.data(), C, C, V, t);
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < V; ++c) out[(t0 + i) * V + c] = qs[i] * qS[i * V + c] + o[i * V + c];
    } else {
      vector<float> X(C * K), W(C * K), U(C * V);
      for (int i = 0; i < C; ++i)
        for (int c = 0; c < K; ++c) X[i * K + c] = xs[i] * Kc[i * K + c];
      mm(Tm.data(), X.data(), W.data(), C, C, K, t);
      mm(Tm.data(), bv.data(), U.data(), C, C, V, t);
      vector<float> WS(C * V);
      mm(W.data(), ST.data(), WS.data(), C, K, V, t);
      for (int i = 0; i < C * V; ++i) u[i] = U[i] - WS[i];
      vector<float> o(C * V);
      mm(P.data(), u.data(), o.data(), C, C, V, t);
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < V; ++c) out[(t0 + i) * V + c] = qs[i] * qS[i * V + c] + o[i * V + c];
    }
    // S ← G S + (ks ⊙ u)ᵀ k
    const float Gd = static_cast<float>(std::exp(cl));
    vector<float> uk(V * C);
    for (int i = 0; i < C; ++i)
      for (int c = 0; c < V; ++c) uk[c * C + i] = ks[i] * u[i * V + c];
    for (float& s : S) s *= Gd;
    mm(uk.data(), Kc.data(), S.data(), V, C, K, t, true);
  }
  return out;
}

int main() {
  const int T = 1024;
  for (float corr : {0.0f, 1.0f, 3.0f})
  for (double ds : {0.02, 0.2}) {
    g_corr = corr;
    for (unsigned seed : {1u}) {
      Problem p = make(T, ds, seed);
      vector<double> Sref;
      vector<double> ref = reference(p, Sref);
      for (int C : {64, 128})
        for (int wu = 0; wu < 2; ++wu)
          for (int t = 0; t < 2; ++t) {
            vector<float> S;
            double maxT;
            vector<float> o = chunked(p, C, t, wu, S, maxT);
            double num = 0, den = 0, mx = 0, sn = 0, sd = 0;
            for (size_t i = 0; i < o.size(); ++i) {
              num += (o[i] - ref[i]) * (o[i] - ref[i]);
              den += ref[i] * ref[i];
              mx = std::max(mx, std::fabs(o[i] - ref[i]));
            }
            for (size_t i = 0; i < S.size(); ++i) {
              sn += (S[i] - Sref[i]) * (S[i] - Sref[i]);
              sd += Sref[i] * Sref[i];
            }
            std::printf("corr %.0f decay x%.2f seed %u C=%3d %s %s: out relL2 %.2e max %.2e  state relL2 %.2e  max|T| %.2f\n", corr, ds, seed,
                        C, wu ? "W/U " : "T.z ", t ? "tf32" : "fp32", std::sqrt(num / den), mx, std::sqrt(sn / sd), maxT);
          }
    }
  }
}
